"""nn.Module wrappers of the fastops ops."""

from fastops.nn.clipped_log import ClippedLog

__all__ = ["ClippedLog"]
