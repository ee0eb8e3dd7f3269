"""squeeze_excite: an SE block whose memory passes (pool, scale, and the backward's one reduction and
one write) are fused kernels; the tiny FCs between them stay ATen GEMMs.

Four registered ops carry the passes (csrc/cpu/squeeze_excite.cpp, csrc/cuda/squeeze_excite.cu); each
has a fake kernel and its own autograd, so each passes ``torch.library.opcheck`` alone. The block
joins them in an ``autograd.Function`` because its backward is not the sum of theirs: eager's
backward of ``x * s`` plus the pool's backward writes ``dx`` twice and adds; ours computes
``dx = g * s + dpool / HW`` in one pass.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from fastops.ops._validate import check_floating, check_tensor, uses_channels_last

_OP = "squeeze_excite"
ACTIVATIONS = ("relu", "silu", "gelu")
GATES = ("sigmoid", "hardsigmoid")
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def check_act(op: str, act: object) -> str:
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"fastops.{op}: expected act to be one of {list(ACTIVATIONS)}, got {act!r}")
    return act


def check_gate(op: str, gate: object) -> str:
    if not isinstance(gate, str) or gate not in GATES:
        raise ValueError(f"fastops.{op}: expected gate to be one of {list(GATES)}, got {gate!r}")
    return gate


def _compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype of the per-channel tensors and the FCs: float64 for float64 x, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check_activation(op: str, arg: str, t: Tensor) -> None:
    check_floating(op, arg, t)
    if t.dim() != 4:
        raise ValueError(f"fastops.{op}: expected {arg} to be 4-D (N, C, H, W), got shape {list(t.shape)}")


def _check_per_channel(op: str, arg: str, t: Tensor, x_arg: str, x: Tensor) -> None:
    if t.device != x.device:
        raise RuntimeError(
            f"fastops.{op}: expected {arg} on the same device as {x_arg} ({x.device}), got {t.device}"
        )
    if t.dtype != _compute_dtype(x):
        raise TypeError(
            f"fastops.{op}: expected {arg} to be {_compute_dtype(x)} (the compute dtype of {x_arg}'s "
            f"{x.dtype}), got {t.dtype}"
        )
    torch._check(
        t.dim() == 2 and t.shape[0] == x.shape[0] and t.shape[1] == x.shape[1],
        lambda: (
            f"fastops.{op}: expected {arg} of shape {[x.shape[0], x.shape[1]]} (N, C), got {list(t.shape)}"
        ),
    )


def _check_fc(arg: str, t: Tensor | None, shape: tuple[int, ...], x: Tensor, optional: bool) -> None:
    if t is None:
        if not optional:
            raise TypeError(f"fastops.{_OP}: expected {arg} to be a torch.Tensor, got None")
        return
    check_tensor(_OP, arg, t)
    if not t.is_floating_point():
        raise TypeError(f"fastops.{_OP}: expected {arg} to be a floating tensor, got {t.dtype}")
    if t.device != x.device:
        raise RuntimeError(
            f"fastops.{_OP}: expected {arg} on the same device as x ({x.device}), got {t.device}"
        )
    if tuple(t.shape) != shape:
        raise ValueError(f"fastops.{_OP}: expected {arg} of shape {list(shape)}, got {list(t.shape)}")


def _check_inputs(
    x: Tensor,
    fc1_weight: Tensor,
    fc1_bias: Tensor | None,
    fc2_weight: Tensor,
    fc2_bias: Tensor | None,
    act: object,
    gate: object,
) -> None:
    check_tensor(_OP, "x", x)
    _check_activation(_OP, "x", x)
    check_tensor(_OP, "fc1_weight", fc1_weight)
    if fc1_weight.dim() != 2:
        raise ValueError(
            f"fastops.{_OP}: expected fc1_weight to be 2-D (reduced_channels, C) as nn.Linear's weight "
            f"(flatten a 1x1 conv's weight), got shape {list(fc1_weight.shape)}"
        )
    channels, reduced = int(x.shape[1]), int(fc1_weight.shape[0])
    _check_fc("fc1_weight", fc1_weight, (reduced, channels), x, optional=False)
    _check_fc("fc1_bias", fc1_bias, (reduced,), x, optional=True)
    _check_fc("fc2_weight", fc2_weight, (channels, reduced), x, optional=False)
    _check_fc("fc2_bias", fc2_bias, (channels,), x, optional=True)
    check_act(_OP, act)
    check_gate(_OP, gate)


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
    _check_inputs(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate)
    return _SqueezeExcite.apply(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias, act, gate)


# ---- the block: forward and its one-reduction, one-write backward -------------------------------


def _act_forward(h: Tensor, act: str) -> Tensor:
    if act == "relu":
        return torch.relu(h)
    if act == "silu":
        return F.silu(h)
    return F.gelu(h)


def _act_backward(grad: Tensor, h: Tensor, act: str) -> Tensor:
    """grad * act'(h), in the form of aten's backward kernels (relu selects, so a NaN or inf grad
    where h <= 0 gives 0 there, as eager does)."""
    if act == "relu":
        return torch.where(h > 0, grad, 0.0)
    if act == "silu":
        sig = torch.sigmoid(h)
        return grad * sig * (1 + h * (1 - sig))
    cdf = 0.5 * torch.special.erfc(-h * math.sqrt(0.5))
    return grad * (cdf + h * torch.exp(-0.5 * h * h) * _INV_SQRT_2PI)


def _gate_forward(z: Tensor, gate: str) -> Tensor:
    return torch.sigmoid(z) if gate == "sigmoid" else F.hardsigmoid(z)


def _gate_backward(grad: Tensor, z: Tensor, s: Tensor, gate: str) -> Tensor:
    """grad * gate'(z) from z and s = gate(z), in aten's forms: sigmoid's grad * (1 - s) * s;
    hardsigmoid's grad / 6 selected strictly inside (-3, 3), 0 elsewhere (also for a NaN grad)."""
    if gate == "sigmoid":
        return grad * (1 - s) * s
    return torch.where((z > -3) & (z < 3), grad / 6, 0.0)


def _linear_in(t: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    return None if t is None else t.to(dtype)


class _SqueezeExcite(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        fc1_weight: Tensor,
        fc1_bias: Tensor | None,
        fc2_weight: Tensor,
        fc2_bias: Tensor | None,
        act: str,
        gate: str,
    ) -> Tensor:
        dtype = _compute_dtype(x)
        pooled = torch.ops.fastops.squeeze_excite_pool.default(x)
        # The FCs run in the compute dtype whatever autocast says: they are (N, C)-sized, and the
        # block's policy is "the dtype of x" (the final x * s), with fp32 math inside.
        with torch.autocast(device_type=x.device.type, enabled=False):
            hidden = F.linear(pooled, fc1_weight.to(dtype), _linear_in(fc1_bias, dtype))
            pre_gate = F.linear(_act_forward(hidden, act), fc2_weight.to(dtype), _linear_in(fc2_bias, dtype))
            scale = _gate_forward(pre_gate, gate)
        y = torch.ops.fastops.squeeze_excite_scale.default(x, scale)
        # x as eager saves it; everything else is (N, C) or (N, R), or a parameter.
        ctx.save_for_backward(x, fc1_weight, fc2_weight, pooled, hidden, pre_gate, scale)
        ctx.act, ctx.gate = act, gate
        ctx.bias_dtypes = (
            None if fc1_bias is None else fc1_bias.dtype,
            None if fc2_bias is None else fc2_bias.dtype,
        )
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, fc1_weight, fc2_weight, pooled, hidden, pre_gate, scale = ctx.saved_tensors
        need = ctx.needs_input_grad
        dtype = pooled.dtype
        grad_x = grad_w1 = grad_b1 = grad_w2 = grad_b2 = None
        grad_scale = torch.ops.fastops.squeeze_excite_backward_reduce.default(grad_out, x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            grad_pre = _gate_backward(grad_scale, pre_gate, scale, ctx.gate)
            if need[3]:
                grad_w2 = (grad_pre.t() @ _act_forward(hidden, ctx.act)).to(fc2_weight.dtype)
            if need[4]:
                grad_b2 = grad_pre.sum(0).to(ctx.bias_dtypes[1])
            grad_hidden = _act_backward(grad_pre @ fc2_weight.to(dtype), hidden, ctx.act)
            if need[1]:
                grad_w1 = (grad_hidden.t() @ pooled).to(fc1_weight.dtype)
            if need[2]:
                grad_b1 = grad_hidden.sum(0).to(ctx.bias_dtypes[0])
            if need[0]:
                grad_pool = grad_hidden @ fc1_weight.to(dtype)
                grad_x = torch.ops.fastops.squeeze_excite_backward_input.default(grad_out, scale, grad_pool)
        return grad_x, grad_w1, grad_b1, grad_w2, grad_b2, None, None


# ---- fake kernels -------------------------------------------------------------------------------


def _empty_in_kernel_layout(t: Tensor) -> Tensor:
    fmt = torch.channels_last if uses_channels_last(t) else torch.contiguous_format
    return torch.empty_like(t, memory_format=fmt)


@torch.library.register_fake("fastops::squeeze_excite_pool")
def _pool_fake(x: Tensor) -> Tensor:
    _check_activation("squeeze_excite_pool", "x", x)
    return x.new_empty((x.shape[0], x.shape[1]), dtype=_compute_dtype(x))


@torch.library.register_fake("fastops::squeeze_excite_scale")
def _scale_fake(x: Tensor, scale: Tensor) -> Tensor:
    _check_activation("squeeze_excite_scale", "x", x)
    _check_per_channel("squeeze_excite_scale", "scale", scale, "x", x)
    return _empty_in_kernel_layout(x)


@torch.library.register_fake("fastops::squeeze_excite_backward_reduce")
def _backward_reduce_fake(grad_out: Tensor, x: Tensor) -> Tensor:
    op = "squeeze_excite_backward_reduce"
    _check_activation(op, "x", x)
    if grad_out.dtype != x.dtype:
        raise TypeError(
            f"fastops.{op}: expected grad_out to have the dtype of x ({x.dtype}), got {grad_out.dtype}"
        )
    torch._check(
        grad_out.shape == x.shape,
        lambda: (
            f"fastops.{op}: expected grad_out to have the shape of x {list(x.shape)}, got {list(grad_out.shape)}"
        ),
    )
    return x.new_empty((x.shape[0], x.shape[1]), dtype=_compute_dtype(x))


@torch.library.register_fake("fastops::squeeze_excite_backward_input")
def _backward_input_fake(grad_out: Tensor, scale: Tensor, grad_pool: Tensor) -> Tensor:
    op = "squeeze_excite_backward_input"
    _check_activation(op, "grad_out", grad_out)
    _check_per_channel(op, "scale", scale, "grad_out", grad_out)
    _check_per_channel(op, "grad_pool", grad_pool, "grad_out", grad_out)
    return _empty_in_kernel_layout(grad_out)


# ---- autograd of each pass (opcheck; a user composing the passes) --------------------------------
# pool(x) = sum_hw x / HW; scale(x, s) = x * s; reduce(g, x) = sum_hw g * x;
# backward_input(g, s, dp) = g * s + dp / HW. Each gradient is again one of the four passes.


def _pool_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    (x,) = inputs
    ctx.x_shape, ctx.x_dtype = x.shape, x.dtype


def _pool_backward(ctx: Any, grad: Tensor) -> Tensor:
    n, c, h, w = ctx.x_shape
    return (grad / (h * w)).to(ctx.x_dtype)[:, :, None, None].expand(n, c, h, w)


def _scale_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, scale = inputs
    ctx.save_for_backward(x, scale)


def _scale_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
    x, scale = ctx.saved_tensors
    grad_x = torch.ops.fastops.squeeze_excite_scale.default(grad, scale) if ctx.needs_input_grad[0] else None
    grad_s = (
        torch.ops.fastops.squeeze_excite_backward_reduce.default(grad, x) if ctx.needs_input_grad[1] else None
    )
    return grad_x, grad_s


def _reduce_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    grad_out, x = inputs
    ctx.save_for_backward(grad_out, x)


def _reduce_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
    grad_out, x = ctx.saved_tensors
    scale = torch.ops.fastops.squeeze_excite_scale.default
    return (
        scale(x, grad) if ctx.needs_input_grad[0] else None,
        scale(grad_out, grad) if ctx.needs_input_grad[1] else None,
    )


def _backward_input_setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    grad_out, scale, _ = inputs
    ctx.save_for_backward(grad_out, scale)


def _backward_input_backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    grad_out, scale = ctx.saved_tensors
    need = ctx.needs_input_grad
    ops = torch.ops.fastops
    return (
        ops.squeeze_excite_scale.default(grad, scale) if need[0] else None,
        ops.squeeze_excite_backward_reduce.default(grad, grad_out) if need[1] else None,
        ops.squeeze_excite_pool.default(grad) if need[2] else None,
    )


torch.library.register_autograd("fastops::squeeze_excite_pool", _pool_backward, setup_context=_pool_setup)
torch.library.register_autograd("fastops::squeeze_excite_scale", _scale_backward, setup_context=_scale_setup)
torch.library.register_autograd(
    "fastops::squeeze_excite_backward_reduce", _reduce_backward, setup_context=_reduce_setup
)
torch.library.register_autograd(
    "fastops::squeeze_excite_backward_input", _backward_input_backward, setup_context=_backward_input_setup
)
# Autocast: none registered on purpose. The block runs in the dtype of x (the FCs inside in float32).
