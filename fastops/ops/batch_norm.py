"""batch_norm: ``F.batch_norm`` over the channels (dim 1) as one statistics + normalisation kernel
forward and one reduction + input-gradient kernel backward (csrc/cpu/batch_norm.cpp,
csrc/cuda/batch_norm.cu). Its autograd is C++ (csrc/batch_norm_op.cpp), first and second derivative."""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from fastops import reference
from fastops.ops._validate import (
    ShapeError,
    check_real,
    check_same_device,
    check_tensor,
    compute_dtype,
    under_torch_func,
    uses_channels_last,
)

_OP = "batch_norm"


def _check_input_shape(op: str, x: Tensor) -> None:
    """What the fake kernels need of x (its channel count); the C++ twin is check_bn_input in
    csrc/include/fastops/batch_norm.h, with the same message."""
    if x.dim() < 2 or x.shape[1] == 0:
        raise ShapeError(
            f"fastops.{op}: expected x to have at least 2 dims (N, C, ...) and at least one channel, "
            f"got shape {list(x.shape)}"
        )


def _check_momentum(op: str, momentum: object) -> float:
    # Any real number, as F.batch_norm takes it (the update is a lerp; 1.5 over-relaxes).
    if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real):
        raise TypeError(f"fastops.{op}: expected momentum to be a real number, got {momentum!r}")
    return float(momentum)


def batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """``torch.nn.functional.batch_norm`` with the arguments in its order, on fastops kernels.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` per channel (dim 1 of x). With
    ``training=True`` mean and var are the batch's (var biased), and ``running_mean`` /
    ``running_var``, when given, are updated in place: ``r = (1 - momentum) * r + momentum * s``
    with the unbiased batch variance for ``running_var``. With ``training=False`` the running
    statistics normalise.

    Args:
        x: (N, C, ...) float32, float16 or bfloat16 (float64 on the CPU), any layout; the output has
            x's dtype, in channels_last when x is channels_last 4-D, else contiguous.
        running_mean, running_var: (C,) in x's dtype or float32 (float64 for float64 x), or None
            (then ``training`` must be True).
        weight, bias: (C,) as the running statistics, or None (1 and 0).
        momentum: a real number, usually in [0, 1]. eps: a finite float > 0, held in the compute dtype (float32, or float64).

    The statistics and all arithmetic are float32 for fp16/bf16 x. Gradients flow to x, weight and
    bias, twice differentiable (the second derivative in PyTorch math). Under autocast it runs in the dtype that arrives,
    as aten's batch_norm does (a bf16 activation with float32 weight and statistics is the usual
    case). An empty x gives an empty output and leaves the running statistics alone.

    Equals: ``F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)``
    (see ``fastops.reference.batch_norm``).
    """
    # The op checks the tensors and eps's range (csrc/include/fastops/batch_norm.h); here only what its
    # schema cannot take, and momentum, which the op never sees.
    check_tensor(_OP, "x", x)
    for arg, t in (
        ("running_mean", running_mean),
        ("running_var", running_var),
        ("weight", weight),
        ("bias", bias),
    ):
        if t is not None:
            check_tensor(_OP, arg, t)
    eps = check_real(_OP, "eps", eps)
    momentum = _check_momentum(_OP, momentum)
    if under_torch_func():  # F.batch_norm, which updates the running statistics itself
        return reference.batch_norm(x, running_mean, running_var, weight, bias, bool(training), momentum, eps)
    y, mean, _, unbiased_var = torch.ops.fastops.batch_norm.default(
        x, weight, bias, running_mean, running_var, bool(training), eps
    )
    if training and x.numel() != 0:
        # The running statistics, as aten updates them. No grad mode needed: the op marks its
        # statistics non-differentiable, and buffers do not require grad.
        for running, batch in ((running_mean, mean), (running_var, unbiased_var)):
            if running is not None:
                running.lerp_(batch if batch.dtype == running.dtype else batch.to(running.dtype), momentum)
    return y


@torch.library.register_fake("fastops::batch_norm")
def _batch_norm_fake(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    training: bool,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # Shape inference needs x's channels and one device; the rest is the kernels' to check, which a
    # compiled graph runs too, so it raises what an eager call raises.
    _check_input_shape(_OP, x)
    check_same_device(_OP, x, weight=weight, bias=bias, running_mean=running_mean, running_var=running_var)
    layout = torch.channels_last if uses_channels_last(x) else torch.contiguous_format
    channels, dtype = x.shape[1], compute_dtype(x)
    return (
        torch.empty_like(x, memory_format=layout),
        x.new_empty((channels,), dtype=dtype),
        x.new_empty((channels,), dtype=dtype),
        x.new_empty((channels if training else 0,), dtype=dtype),
    )


@torch.library.register_fake("fastops::batch_norm_backward")
def _batch_norm_backward_fake(
    grad_out: Tensor,
    x: Tensor,
    weight: Tensor | None,
    mean: Tensor,
    invstd: Tensor,
    training: bool,
    input_grad: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    op = "batch_norm_backward"
    _check_input_shape(op, x)
    torch._check(
        grad_out.shape == x.shape and grad_out.dtype == x.dtype,
        lambda: f"fastops.{op}: expected grad_out to have the shape and dtype of x",
    )
    dtype = compute_dtype(x)
    for arg, t in (("mean", mean), ("invstd", invstd)):
        torch._check(
            t.dtype == dtype and t.dim() == 1 and t.shape[0] == x.shape[1],
            lambda arg=arg: f"fastops.{op}: expected {arg} to be a {dtype} tensor of shape [{x.shape[1]}]",
        )
    layout = torch.channels_last if uses_channels_last(x) else torch.contiguous_format
    grad_x = torch.empty_like(x, memory_format=layout) if input_grad else x.new_empty((0,))
    return grad_x, x.new_empty((x.shape[1],), dtype=dtype), x.new_empty((x.shape[1],), dtype=dtype)
