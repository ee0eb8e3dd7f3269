"""Plain-PyTorch depthwise_separable_conv2d: the definition every test and benchmark compares against."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from fastops.reference.depthwise_conv2d import depthwise_conv2d


def depthwise_separable_conv2d(
    x: Tensor,
    dw_weight: Tensor,
    dw_bias: Tensor | None,
    pw_weight: Tensor,
    pw_bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
) -> Tensor:
    """``F.conv2d(F.conv2d(x, dw_weight, dw_bias, stride, padding, dilation, groups=C), pw_weight, pw_bias)``:
    a depthwise conv, weight (C, 1, kh, kw), then a 1x1 conv, weight (Cout, C, 1, 1). Padding as
    the op takes it, four ints (top, bottom, left, right) too."""
    z = depthwise_conv2d(x, dw_weight, dw_bias, stride, padding, dilation)
    return F.conv2d(z, pw_weight, pw_bias)
