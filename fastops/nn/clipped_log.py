"""fastops.nn.ClippedLog: the module face of fastops.clipped_log."""

from __future__ import annotations

import torch
from torch import Tensor

from fastops import policy
from fastops.nn._twin import REFUSED
from fastops.ops._validate import check_positive_float
from fastops.ops.clipped_log import clipped_log
from fastops.policy import is_compiling
from fastops.reference.clipped_log import clipped_log as reference_clipped_log

_CLIPPED_LOG_OP = torch.ops.fastops.clipped_log.default
_RUN_CLIPPED_LOG = policy.compiled_runner("clipped_log")


class ClippedLog(policy.TunedModule):
    """``y = log(clamp(x, min=eps))``; see :func:`fastops.clipped_log` for dtypes and gradients.
    ``backend``: see :mod:`fastops.policy` (under ``"auto"``, PyTorch's clamp and log run where they
    are measured faster on this machine, with the same gradient)."""

    policy_ops = ("clipped_log",)

    def __init__(self, eps: float = 1e-6, straight_through: bool = True) -> None:
        super().__init__()
        self.eps = check_positive_float("nn.ClippedLog", "eps", eps)
        self.straight_through = bool(straight_through)

    def fastops_details(self) -> str:
        return f"straight_through={self.straight_through}"

    def forward(self, x: Tensor) -> Tensor:
        if not is_compiling():
            try:  # ours, when chosen for this x (measured faster, or forced by backend)
                y = _RUN_CLIPPED_LOG(self, x, self.eps, self.straight_through)
            except REFUSED:
                y = None  # the path below names what was wrong
            if y is not None:
                return y
        return super().forward(x)

    def _fastops_forward(self, x: Tensor) -> Tensor:
        # The registered op called directly (its C++ kernel checks x and eps against x's dtype; the
        # constructor checked eps).
        try:
            return _CLIPPED_LOG_OP(x, self.eps, self.straight_through)
        except REFUSED:
            if isinstance(x, Tensor):
                raise
            return clipped_log(x, self.eps, self.straight_through)  # names the non-Tensor x

    def _torch_forward(self, x: Tensor) -> Tensor:
        # PyTorch's clamp and log, with the same (straight-through or not) gradient.
        return reference_clipped_log(x, self.eps, self.straight_through)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, straight_through={self.straight_through}"
