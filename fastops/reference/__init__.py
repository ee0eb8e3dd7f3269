"""Plain-PyTorch definitions of every op: what tests, benchmarks and docs compare against."""

from fastops.reference.clipped_log import clipped_log
from fastops.reference.fused_adam import adam_step

__all__ = ["adam_step", "clipped_log"]
