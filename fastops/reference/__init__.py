"""Plain-PyTorch definitions of every op: what tests, benchmarks and docs compare against."""

from fastops.reference.clipped_log import clipped_log
from fastops.reference.depthwise_conv2d import depthwise_conv2d

__all__ = ["clipped_log", "depthwise_conv2d"]
