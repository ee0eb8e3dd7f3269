"""Plain-PyTorch depthwise_conv2d: the definition every test and benchmark compares against."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor


def depthwise_conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
) -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, dilation, groups=C)`` with weight (C, 1, kh, kw);
    four ints of padding (top, bottom, left, right) zero-pad x with ``F.pad`` first."""
    if not isinstance(padding, (int, str)) and len(padding) == 4:
        top, bottom, left, right = padding
        x, padding = F.pad(x, (left, right, top, bottom)), 0
    return F.conv2d(x, weight, bias, stride, padding, dilation, groups=x.shape[1])
