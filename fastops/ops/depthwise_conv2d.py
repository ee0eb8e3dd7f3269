"""depthwise_conv2d: F.conv2d(..., groups=C) with our own kernels for NCHW and channels_last, forward,
input gradient and a deterministic weight/bias gradient."""

from __future__ import annotations

import torch
from torch import Tensor

from fastops import reference
from fastops.ops._validate import (
    IntPair,
    ShapeError,
    check_same_device,
    check_tensor,
    conv_out_hw,
    int_pair,
    kernel_hw,
    resolve_padding,
    under_torch_func,
    uses_channels_last,
)

_OP = "depthwise_conv2d"


def depthwise_conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: IntPair = 1,
    padding: IntPair | tuple[int, int, int, int] | str = 0,
    dilation: IntPair = 1,
) -> Tensor:
    """Depthwise 2-D convolution: ``F.conv2d(x, weight, bias, stride, padding, dilation, groups=C)``.

    Args:
        x: (N, C, H, W), float32, float16 or bfloat16 (float64 on the CPU), CPU or CUDA. A
            channels_last x runs the NHWC kernels and gives a channels_last output; any other x runs
            the NCHW kernels (non-contiguous views are made contiguous first) and gives a contiguous
            output.
        weight: (C, 1, kh, kw) of x's dtype and device — channel multiplier 1 (a (C*m, 1, kh, kw)
            weight with m > 1 is rejected). Any kernel size.
        bias: None or (C,).
        stride, dilation: int or (h, w) pair, >= 1.
        padding: int or (h, w) pair >= 0, or "valid" / "same" (as F.conv2d; "same" needs stride 1),
            or four ints (top, bottom, left, right) for asymmetric zero padding (what
            ``F.conv2d(F.pad(x, (left, right, top, bottom)), ...)`` computes, without the padded copy).

    Returns (N, C, OH, OW) with OH = (H + 2*pad_h - dilation_h*(kh - 1) - 1) // stride_h + 1.

    Gradients for x, weight and bias come from our kernels; the weight/bias gradient accumulates in
    fp32 (fp64 for fp64 inputs) over a fixed partition of the work and is bitwise repeatable.
    Under autocast it runs in the autocast dtype, as conv2d does.

    Equals: ``torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups=x.shape[1])``
    (see ``fastops.reference.depthwise_conv2d``).
    """
    # The op checks the tensors and the geometry (csrc/include/fastops/depthwise.h); here only what its
    # schema cannot take, and the parsing of stride, padding and dilation into the lists it takes.
    check_tensor(_OP, "x", x)
    check_tensor(_OP, "weight", weight)
    if bias is not None:
        check_tensor(_OP, "bias", bias)
    s = int_pair(_OP, "stride", stride, 1)
    d = int_pair(_OP, "dilation", dilation, 1)
    p = resolve_padding(_OP, padding, kernel_hw(weight), s, d)
    if under_torch_func():
        return reference.depthwise_conv2d(x, weight, bias, s, p, d)
    return torch.ops.fastops.depthwise_conv2d.default(x, weight, bias, list(s), list(p), list(d))


def _check_shapes(x: Tensor, weight: Tensor) -> None:
    """What the fake kernel needs to shape the output: x's and the kernel's sizes (and one device,
    checked after these as the kernels check it). The C++ twins
    (check_depthwise_inputs, check_depthwise_weight in csrc/include/fastops/depthwise.h) raise the
    same errors; the rest is the kernels' to check, which a compiled graph runs too."""
    if x.dim() != 4:
        raise ShapeError(f"fastops.{_OP}: expected x to be 4-D (N, C, H, W), got shape {tuple(x.shape)}")
    if weight.dim() != 4 or weight.shape[1] != 1:
        raise ShapeError(
            f"fastops.{_OP}: expected weight of shape (C, 1, kh, kw) (channel multiplier 1), "
            f"got {tuple(weight.shape)}"
        )
    if weight.shape[2] < 1 or weight.shape[3] < 1:
        raise ShapeError(
            f"fastops.{_OP}: expected a kernel of at least 1 x 1, got weight of shape {tuple(weight.shape)}"
        )


@torch.library.register_fake("fastops::depthwise_conv2d")
def _fake(x: Tensor, weight: Tensor, bias: Tensor | None, stride, padding, dilation) -> Tensor:
    _check_shapes(x, weight)
    check_same_device(_OP, x, weight=weight, bias=bias)
    oh, ow = conv_out_hw(_OP, x.shape[2], x.shape[3], weight.shape[2:], stride, padding, dilation)
    fmt = torch.channels_last if uses_channels_last(x) else torch.contiguous_format
    return x.new_empty((x.shape[0], x.shape[1], oh, ow)).contiguous(memory_format=fmt)


@torch.library.register_fake("fastops::depthwise_conv2d_backward_input")
def _fake_dgrad(
    grad_out: Tensor, weight: Tensor, input_size, stride, padding, dilation, channels_last: bool
) -> Tensor:
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return grad_out.new_empty(tuple(input_size)).contiguous(memory_format=fmt)


@torch.library.register_fake("fastops::depthwise_conv2d_backward_weight")
def _fake_wgrad(grad_out: Tensor, x: Tensor, kernel_size, stride, padding, dilation) -> tuple[Tensor, Tensor]:
    c = x.shape[1]
    return x.new_empty((c, 1, kernel_size[0], kernel_size[1])), x.new_empty((c,))


# The autograd is C++ (csrc/depthwise_conv2d_op.cpp: no Python on the way of a call): saves x and the weight,
# calls depthwise_conv2d_backward_input / _backward_weight for the gradients asked for.
# Autocast (conv2d's policy: run in the autocast dtype) is registered in C++ (csrc/depthwise_conv2d_op.cpp),
# since torch.library.register_autocast can only name a fixed dtype.
