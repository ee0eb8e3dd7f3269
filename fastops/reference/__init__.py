"""Plain-PyTorch definitions of every op: what tests, benchmarks and docs compare against."""

from fastops.reference.clipped_log import clipped_log

__all__ = ["clipped_log"]
