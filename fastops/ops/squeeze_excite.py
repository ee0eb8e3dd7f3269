"""squeeze_excite: an SE block whose memory passes (pool, scale, and the backward's one reduction and
one write) are fused kernels; the tiny FCs between them are ATen GEMMs, or on an AVX-512 CPU with a
float32 batch of at most 16 our small-batch FC kernels (csrc/cpu/squeeze_excite.cpp).

Four registered ops carry the passes (csrc/cpu/squeeze_excite.cpp, csrc/cuda/squeeze_excite.cu); each
has a fake kernel (here) and its own autograd (C++, csrc/squeeze_excite_op.cpp), so each passes
``torch.library.opcheck`` alone. The block is one more op, ``squeeze_excite``, whose autograd is C++
too (csrc/squeeze_excite_op.cpp): its backward
is not the sum of the passes' backwards (eager's backward of ``x * s`` plus the pool's backward
writes ``dx`` twice and adds; ours computes ``dx = g * s + dpool / HW`` in one pass), and on the small
maps of MobileNetV3 a Python autograd node and a dozen Python-to-C++ steps cost as much as the
passes. Its forward and backward are the ops ``squeeze_excite_forward`` / ``squeeze_excite_backward``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fastops import reference
from fastops.ops._validate import (
    ShapeError,
    check_same_device,
    check_tensor,
    compute_dtype,
    under_torch_func,
    uses_channels_last,
)

_OP = "squeeze_excite"
ACTIVATIONS = ("relu", "silu", "gelu")
GATES = ("sigmoid", "hardsigmoid")


def check_act(op: str, act: object) -> str:
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"fastops.{op}: expected act to be one of {list(ACTIVATIONS)}, got {act!r}")
    return act


def check_gate(op: str, gate: object) -> str:
    if not isinstance(gate, str) or gate not in GATES:
        raise ValueError(f"fastops.{op}: expected gate to be one of {list(GATES)}, got {gate!r}")
    return gate


def _check_activation_shape(op: str, arg: str, t: Tensor) -> None:
    """What the fake kernels need of x (or grad_out): its 4 dims. The C++ twin is check_se_activation
    in csrc/include/fastops/squeeze_excite.h, with the same message."""
    if t.dim() != 4:
        raise ShapeError(f"fastops.{op}: expected {arg} to be 4-D (N, C, H, W), got shape {list(t.shape)}")


def squeeze_excite(
    x: Tensor,
    fc1_weight: Tensor,
    fc1_bias: Tensor | None,
    fc2_weight: Tensor,
    fc2_bias: Tensor | None,
    act: str = "relu",
    gate: str = "sigmoid",
) -> Tensor:
    """Squeeze-excitation: ``x * gate(fc2(act(fc1(mean_hw(x)))))`` with fused memory passes.

    Args:
        x: (N, C, H, W), float32, float16 or bfloat16 (float64 on the CPU), CPU or CUDA. A
            channels_last x runs the NHWC kernels and gives a channels_last output; any other x runs
            the NCHW kernels (non-contiguous views are made contiguous first) and gives a contiguous
            output. N = 0 is fine.
        fc1_weight, fc1_bias: (R, C) and (R,) or None: the squeeze FC (nn.Linear's layout; a 1x1
            conv's (R, C, 1, 1) weight passes as ``weight.flatten(1)``).
        fc2_weight, fc2_bias: (C, R) and (C,) or None: the excite FC.
        act: ``"relu"``, ``"silu"`` or ``"gelu"`` (erf form) between the FCs.
        gate: ``"sigmoid"`` or ``"hardsigmoid"`` (``relu6(z + 3) / 6``).

    The pool accumulates in float32 (float64 for float64 x) and the FCs, act and gate run in that
    dtype whatever the weights' dtype (any floating dtype on x's device; their gradients come back
    in it), so fp16/bf16 x loses nothing before the final ``x * s``, which is rounded once. Under
    autocast it runs in the dtype of x, like ``x * s`` does.

    Gradient: one pass reads ``g`` and ``x`` for ``ds[n, c] = sum_hw g * x``; the FC chain's
    gradient is ATen on (N, C) tensors; one pass writes ``dx = g * s + dpool / HW``. Saved for
    backward: x (as eager saves it) and (N, C)-sized tensors only. Every per-(n, c) sum is taken by
    one thread in a fixed order, so the results are bitwise repeatable. Differentiable once (the
    saved (N, C) intermediates carry no graph; a double backward raises).
    NaN and inf propagate as in the eager expression.

    Equals: ``x * gate(F.linear(act(F.linear(x.mean((2, 3)), fc1_weight, fc1_bias)), fc2_weight,
    fc2_bias))[:, :, None, None]`` (see ``fastops.reference.squeeze_excite``).
    """
    # The op checks the tensors, act and gate (csrc/squeeze_excite_op.cpp); here only what its schema
    # cannot take.
    for arg, value in (("x", x), ("fc1_weight", fc1_weight), ("fc2_weight", fc2_weight)):
        check_tensor(_OP, arg, value)
    for arg, opt in (("fc1_bias", fc1_bias), ("fc2_bias", fc2_bias)):
        if opt is not None:
            check_tensor(_OP, arg, opt)
    if type(act) is not str:
        check_act(_OP, act)
    if type(gate) is not str:
        check_gate(_OP, gate)
    if under_torch_func():
        return reference.squeeze_excite(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate)
    return torch.ops.fastops.squeeze_excite.default(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate)


# ---- fake kernels -------------------------------------------------------------------------------
# Each checks what it needs to shape its outputs, and one device for them; the rest is the kernels' to
# check, which a compiled graph runs too, so it raises what an eager call raises.


def _empty_in_kernel_layout(t: Tensor) -> Tensor:
    fmt = torch.channels_last if uses_channels_last(t) else torch.contiguous_format
    return torch.empty_like(t, memory_format=fmt)


@torch.library.register_fake("fastops::squeeze_excite_pool")
def _pool_fake(x: Tensor) -> Tensor:
    _check_activation_shape("squeeze_excite_pool", "x", x)
    return x.new_empty((x.shape[0], x.shape[1]), dtype=compute_dtype(x))


@torch.library.register_fake("fastops::squeeze_excite_scale")
def _scale_fake(x: Tensor, scale: Tensor) -> Tensor:
    _check_activation_shape("squeeze_excite_scale", "x", x)
    check_same_device("squeeze_excite_scale", x, scale=scale)
    return _empty_in_kernel_layout(x)


@torch.library.register_fake("fastops::squeeze_excite_backward_reduce")
def _backward_reduce_fake(grad_out: Tensor, x: Tensor) -> Tensor:
    _check_activation_shape("squeeze_excite_backward_reduce", "x", x)
    return x.new_empty((x.shape[0], x.shape[1]), dtype=compute_dtype(x))


@torch.library.register_fake("fastops::squeeze_excite_backward_input")
def _backward_input_fake(grad_out: Tensor, scale: Tensor, grad_pool: Tensor) -> Tensor:
    op = "squeeze_excite_backward_input"
    _check_activation_shape(op, "grad_out", grad_out)
    check_same_device(op, grad_out, "grad_out", scale=scale, grad_pool=grad_pool)
    return _empty_in_kernel_layout(grad_out)


@torch.library.register_fake("fastops::squeeze_excite")
def _block_fake(
    x: Tensor,
    fc1_weight: Tensor,
    fc1_bias: Tensor | None,
    fc2_weight: Tensor,
    fc2_bias: Tensor | None,
    act: str,
    gate: str,
) -> Tensor:
    _check_activation_shape(_OP, "x", x)
    check_same_device(
        _OP, x, fc1_weight=fc1_weight, fc1_bias=fc1_bias, fc2_weight=fc2_weight, fc2_bias=fc2_bias
    )
    return _empty_in_kernel_layout(x)


@torch.library.register_fake("fastops::squeeze_excite_forward")
def _forward_fake(
    x: Tensor,
    fc1_weight: Tensor,
    fc1_bias: Tensor | None,
    fc2_weight: Tensor,
    fc2_bias: Tensor | None,
    act: str,
    gate: str,
) -> tuple[Tensor, ...]:
    op = "squeeze_excite_forward"
    _check_activation_shape(op, "x", x)
    if fc1_weight.dim() != 2:  # its R shapes two outputs
        raise ShapeError(
            f"fastops.{op}: expected fc1_weight to be 2-D (reduced_channels, C) as nn.Linear's weight "
            f"(flatten a 1x1 conv's weight), got shape {list(fc1_weight.shape)}"
        )
    check_same_device(
        op, x, fc1_weight=fc1_weight, fc1_bias=fc1_bias, fc2_weight=fc2_weight, fc2_bias=fc2_bias
    )
    dtype = compute_dtype(x)
    n, c, r = x.shape[0], x.shape[1], fc1_weight.shape[0]
    pooled, pre_gate, scale = (x.new_empty((n, c), dtype=dtype) for _ in range(3))
    hidden, activated = (x.new_empty((n, r), dtype=dtype) for _ in range(2))
    return _empty_in_kernel_layout(x), pooled, hidden, activated, pre_gate, scale


@torch.library.register_fake("fastops::squeeze_excite_backward")
def _block_backward_fake(
    grad_out: Tensor,
    x: Tensor,
    fc1_weight: Tensor,
    fc2_weight: Tensor,
    pooled: Tensor,
    hidden: Tensor,
    activated: Tensor,
    pre_gate: Tensor,
    scale: Tensor,
    act: str,
    gate: str,
    input_grad: bool,
) -> tuple[Tensor, ...]:
    _check_activation_shape("squeeze_excite_backward", "x", x)
    dtype = compute_dtype(x)
    grad_x = _empty_in_kernel_layout(grad_out) if input_grad else grad_out.new_empty((0,))
    return (
        grad_x,
        fc1_weight.new_empty(fc1_weight.shape, dtype=dtype),
        fc1_weight.new_empty((fc1_weight.shape[0],), dtype=dtype),
        fc2_weight.new_empty(fc2_weight.shape, dtype=dtype),
        fc2_weight.new_empty((fc2_weight.shape[0],), dtype=dtype),
    )


# Autograd is C++ (csrc/squeeze_excite_op.cpp), the block's and each pass's. Autocast: none registered
# on purpose. The block runs in the dtype of x (the FCs inside in float32).
