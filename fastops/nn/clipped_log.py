"""fastops.nn.ClippedLog: the module face of fastops.clipped_log."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fastops import policy
from fastops.nn._twin import refuse_script
from fastops.ops._validate import check_positive_float
from fastops.ops.clipped_log import clipped_log
from fastops.reference.clipped_log import clipped_log as reference_clipped_log


class ClippedLog(nn.Module):
    """``y = log(clamp(x, min=eps))``; see :func:`fastops.clipped_log` for dtypes and gradients.
    ``backend``: see :mod:`fastops.policy` (under ``"auto"``, PyTorch's clamp and log run where they
    are measured faster)."""

    __prepare_scriptable__ = refuse_script  # torch.jit.script: a clear refusal

    backend: str = "auto"  # see fastops.policy
    policy_ops = ("clipped_log",)

    def __init__(self, eps: float = 1e-6, straight_through: bool = True) -> None:
        super().__init__()
        self.eps = check_positive_float("nn.ClippedLog", "eps", eps)
        self.straight_through = bool(straight_through)

    def forward(self, x: Tensor) -> Tensor:
        if policy.runs_torch(self, "clipped_log", x):
            # PyTorch's clamp and log, with the same (straight-through or not) gradient.
            return reference_clipped_log(x, self.eps, self.straight_through)
        return clipped_log(x, self.eps, self.straight_through)

    def extra_repr(self) -> str:
        return f"eps={self.eps}, straight_through={self.straight_through}"


# A small fp32 forward on AVX2: ATen's clamp then log beat our one pass in cache, whose log (at::vec's,
# Sleef's u10 with a division) costs more than ATen's; from 16M elements ours is 1.0-1.24x, and
# forward+backward 2.4-3.4x at every size. 1 thread, the Zen 5 host (2026-11-28).
_AVX2 = "benchmarks/results/clipped_log_cpu_avx2_zen5_threads1.md"
_AVX2_MKL = "benchmarks/results/clipped_log_cpu_avx2_mkl_avx2_zen5_threads1.md"
policy.register_slower_region(
    policy.SlowerRegion(
        "clipped_log",
        "cpu",
        "avx2 float32 inference, up to 2^20 elements",
        f"{_AVX2}: forward 0.85x (64K), 0.89x (1M); {_AVX2_MKL} (MKL capped to AVX2 too): 0.84x, 1.01x",
        lambda case: math.prod(case.shape) <= 1 << 20,
        isas=("avx2",),
        dtypes=(torch.float32,),
        backward=False,
    )
)
