"""depthwise_separable_conv2d: a depthwise conv and the 1x1 conv after it in one CPU kernel (the
depthwise output stays in a cache-sized tile and never goes to memory); backward recomputes it."""

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
)

_OP = "depthwise_separable_conv2d"


def depthwise_separable_conv2d(
    x: Tensor,
    dw_weight: Tensor,
    dw_bias: Tensor | None,
    pw_weight: Tensor,
    pw_bias: Tensor | None = None,
    stride: IntPair = 1,
    padding: IntPair | str = 0,
    dilation: IntPair = 1,
) -> Tensor:
    """Depthwise conv then 1x1 conv, fused: ``F.conv2d(F.conv2d(x, dw_weight, dw_bias, stride, padding,
    dilation, groups=C), pw_weight, pw_bias)``.

    Args:
        x: (N, C, H, W), float32, float16 or bfloat16 (float64 too), CPU only (no CUDA kernel). The
            kernel works on channels_last data: a channels_last x is read in place, any other x is
            converted to channels_last first (an extra copy; pass channels_last for the fast path).
        dw_weight: (C, 1, kh, kw) of x's dtype — channel multiplier 1. Any kernel size.
        dw_bias: None or (C,).
        pw_weight: (Cout, C, 1, 1).
        pw_bias: None or (Cout,).
        stride, dilation: int or (h, w) pair, >= 1 (of the depthwise conv).
        padding: int or (h, w) pair >= 0, or "valid" / "same" (as F.conv2d; "same" needs stride 1).

    Returns (N, Cout, OH, OW), channels_last, OH/OW as for the depthwise conv. The depthwise output
    is rounded to x's dtype before the 1x1 (as the unfused pair stores it); both convs accumulate in
    fp32 (fp64 for fp64).

    Gradient: backward recomputes the depthwise output with :func:`fastops.depthwise_conv2d`, then the
    1x1's gradients are two GEMMs on the channels_last views and the depthwise gradients come from
    the depthwise op's backward kernels. Under autocast it runs in the autocast dtype, as conv2d does.

    Equals ``fastops.reference.depthwise_separable_conv2d``.
    """
    # The op checks the tensors, their device (a CPU kernel only) and the geometry
    # (csrc/cpu/depthwise_separable_conv2d.cpp); here only what its schema cannot take, and the
    # parsing of stride, padding and dilation into the lists it takes.
    for arg, value in (("x", x), ("dw_weight", dw_weight), ("pw_weight", pw_weight)):
        check_tensor(_OP, arg, value)
    for arg, opt in (("dw_bias", dw_bias), ("pw_bias", pw_bias)):
        if opt is not None:
            check_tensor(_OP, arg, opt)
    s = int_pair(_OP, "stride", stride, 1)
    d = int_pair(_OP, "dilation", dilation, 1)
    p = resolve_padding(_OP, padding, kernel_hw(dw_weight), s, d)
    if under_torch_func():
        return reference.depthwise_separable_conv2d(x, dw_weight, dw_bias, pw_weight, pw_bias, s, p, d)
    return torch.ops.fastops.depthwise_separable_conv2d.default(
        x, dw_weight, dw_bias, pw_weight, pw_bias, list(s), list(p), list(d)
    )


def _check_shapes(x: Tensor, dw_weight: Tensor, pw_weight: Tensor) -> None:
    """What the fake kernel needs to shape the output: x's, the kernel's and Cout. The C++ twin
    (check_inputs in csrc/cpu/depthwise_separable_conv2d.cpp) raises the same errors; the rest is
    the kernel's to check, which a compiled graph runs too."""
    if x.dim() != 4:
        raise ShapeError(f"fastops.{_OP}: expected x to be 4-D (N, C, H, W), got shape {tuple(x.shape)}")
    c = x.shape[1]
    if dw_weight.dim() != 4 or dw_weight.shape[1] != 1 or dw_weight.shape[0] != c:
        raise ShapeError(
            f"fastops.{_OP}: expected dw_weight of shape ({c}, 1, kh, kw) (channel multiplier 1), "
            f"got {tuple(dw_weight.shape)}"
        )
    if dw_weight.shape[2] < 1 or dw_weight.shape[3] < 1:
        raise ShapeError(
            f"fastops.{_OP}: expected a kernel of at least 1 x 1, got dw_weight of shape {tuple(dw_weight.shape)}"
        )
    if pw_weight.dim() != 4 or tuple(pw_weight.shape[1:]) != (c, 1, 1):
        raise ShapeError(
            f"fastops.{_OP}: expected pw_weight of shape (Cout, {c}, 1, 1), got {tuple(pw_weight.shape)}"
        )


@torch.library.register_fake("fastops::depthwise_separable_conv2d")
def _fake(
    x: Tensor, dw_weight: Tensor, dw_bias, pw_weight: Tensor, pw_bias, stride, padding, dilation
) -> Tensor:
    _check_shapes(x, dw_weight, pw_weight)
    check_same_device(_OP, x, dw_weight=dw_weight, dw_bias=dw_bias, pw_weight=pw_weight, pw_bias=pw_bias)
    oh, ow = conv_out_hw(_OP, x.shape[2], x.shape[3], dw_weight.shape[2:], stride, padding, dilation)
    return x.new_empty((x.shape[0], pw_weight.shape[0], oh, ow)).contiguous(memory_format=torch.channels_last)


# Autograd and autocast (conv2d's policy: run in the autocast dtype) are C++
# (csrc/depthwise_separable_conv2d_op.cpp).
