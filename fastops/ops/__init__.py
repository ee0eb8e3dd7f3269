"""Public functions of every op, with their fake kernels, autograd and autocast rules."""

from fastops.ops.clipped_log import clipped_log
from fastops.ops.depthwise_conv2d import depthwise_conv2d

__all__ = ["clipped_log", "depthwise_conv2d"]
