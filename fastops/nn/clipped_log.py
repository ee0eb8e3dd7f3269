"""fastops.nn.ClippedLog: the module face of fastops.clipped_log."""

from __future__ import annotations

from torch import Tensor, nn

from fastops.ops._validate import check_positive_float
from fastops.ops.clipped_log import clipped_log


class ClippedLog(nn.Module):
    """``y = log(clamp(x, min=eps))``; see :func:`fastops.clipped_log` for dtypes and gradients."""

    def __init__(self, eps: float = 1e-6, straight_through: bool = True) -> None:
        super().__init__()
        self.eps = check_positive_float("nn.ClippedLog", "eps", eps)
        self.straight_through = bool(straight_through)

    def forward(self, x: Tensor) -> Tensor:
        return clipped_log(x, self.eps, self.straight_through)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, straight_through={self.straight_through}"
