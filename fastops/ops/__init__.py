"""Public functions of every op, with their fake kernels, autograd and autocast rules."""

from fastops.ops.clipped_log import clipped_log

__all__ = ["clipped_log"]
