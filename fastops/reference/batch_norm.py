"""Plain-PyTorch batch_norm: the definition every test and benchmark compares against."""

from __future__ import annotations

from torch import Tensor
from torch.nn import functional as F


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
    """``F.batch_norm`` itself: per-channel (dim 1) normalisation by the batch statistics (training,
    updating the running ones in place) or by the running statistics (eval).

    x is made contiguous first: aten's CPU backward gives wrong input gradients for some views
    whose size-1 dims make them channels_last-like (seen with torch 2.13: shape (1, 16, 1, 2), strides
    (1, 1, 1, 16)); the values do not depend on the layout."""
    return F.batch_norm(x.contiguous(), running_mean, running_var, weight, bias, training, momentum, eps)
