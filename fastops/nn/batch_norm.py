"""fastops.nn.BatchNorm2d: the module face of fastops.batch_norm, and the swap rule for
``nn.BatchNorm2d``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fastops import policy
from fastops.nn._twin import share_parameters
from fastops.ops.batch_norm import batch_norm
from fastops.swap import SwapRule, class_path, overrides, register_swap_rule

_STATE = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


class BatchNorm2d(nn.BatchNorm2d):
    """Drop-in for ``torch.nn.BatchNorm2d`` on fastops kernels: a subclass with the same
    constructor, parameters, buffers, state_dict, running-statistics bookkeeping (``momentum``,
    ``momentum=None`` for a cumulative average, ``track_running_stats``, ``num_batches_tracked``)
    and train/eval behaviour; only the kernels differ (see :func:`fastops.batch_norm`). Being an
    ``nn.BatchNorm2d``, it is converted by ``nn.SyncBatchNorm.convert_sync_batchnorm`` like one.
    ``backend``: see :mod:`fastops.policy`."""

    backend: str = "auto"
    policy_ops = ("batch_norm",)

    @classmethod
    def from_torch(cls, m: nn.BatchNorm2d) -> BatchNorm2d:
        """A fastops BatchNorm2d holding ``m``'s own Parameter and buffer objects (no copy), so the
        running statistics and ``num_batches_tracked`` advance in both."""
        if not isinstance(m, nn.BatchNorm2d):
            raise TypeError(
                f"fastops.nn.BatchNorm2d.from_torch: expected a torch.nn.BatchNorm2d, got {class_path(type(m))}"
            )
        new = cls(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats, device="meta")
        share_parameters(new, m, _STATE)
        new.train(m.training)
        return new

    def forward(self, x: Tensor) -> Tensor:
        self._check_input_dim(x)
        if policy.runs_torch(self, "batch_norm", x):
            return super().forward(x)
        # nn.BatchNorm2d's own bookkeeping, step for step.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        keep_stats = not self.training or self.track_running_stats
        return batch_norm(
            x,
            self.running_mean if keep_stats else None,
            self.running_var if keep_stats else None,
            self.weight,
            self.bias,
            batch_stats,
            factor,
            self.eps,
        )


def _skip_reason(m: nn.BatchNorm2d) -> str | None:
    changed = overrides(type(m), nn.BatchNorm2d, "forward")
    return f"subclass of nn.BatchNorm2d overrides {', '.join(changed)}()" if changed else None


register_swap_rule(
    SwapRule(
        "batch_norm",
        matches=lambda m: isinstance(m, nn.BatchNorm2d) and not isinstance(m, BatchNorm2d),
        replace=BatchNorm2d.from_torch,
        skip_reason=_skip_reason,
    )
)

# Never slower on CUDA until measured: no GPU run has timed this kernel against cuDNN's yet, so
# modules keep cuDNN's there. The CPU numbers are in the file below; the region goes once a GPU
# run shows ours at or above eager.
_CPU_RESULTS = "benchmarks/results/batch_norm_cpu_zen5_threads1.md"
policy.register_slower_region(
    policy.SlowerRegion(
        "batch_norm",
        "cuda",
        "every dtype and layout, until a GPU run measures it",
        f"not yet measured on a GPU (CPU only: {_CPU_RESULTS}); cuDNN's batch norm runs meanwhile",
    )
)

# Where aten's CPU batch norm is at least as fast (bench_batch_norm, 1 thread, thread time, training
# mode). fp16 was not measured apart: it runs the code of bf16 and is held with it.
_CPU_AVX2 = "benchmarks/results/batch_norm_cpu_avx2_zen5_threads1.md"
policy.register_slower_region(
    policy.SlowerRegion(
        "batch_norm",
        "cpu",
        "fp16/bf16 on AVX2 (no fast fp32 -> bf16 narrowing; aten's own bf16 kernels are close to ours)",
        f"{_CPU_AVX2}: bf16 fwd 0.44-1.26x, fwd+bwd 0.69-1.38x eager (7x7 planes 0.44x / 0.69x)",
        isas=("avx2",),
        dtypes=(torch.float16, torch.bfloat16),
    )
)
policy.register_slower_region(
    policy.SlowerRegion(
        "batch_norm",
        "cpu",
        "NCHW fp16/bf16 with maps of at most 16 elements (4x4): one vector a plane",
        f"{_CPU_RESULTS}: 64x128x4x4 bf16 fwd 0.82x, fwd+bwd 0.90x eager (larger maps 1.06-2.13x)",
        lambda case: len(case.shape) > 2 and _map_elements(case.shape) <= 16,
        isas=("avx512",),
        channels_last=False,
        dtypes=(torch.float16, torch.bfloat16),
    )
)


def _map_elements(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[2:]:
        n *= d
    return n
