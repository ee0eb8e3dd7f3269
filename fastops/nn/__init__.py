"""nn.Module wrappers of the fastops ops."""

from fastops.nn.clipped_log import ClippedLog
from fastops.nn.gelu import GELU, BiasGELU, LinearGELU

__all__ = ["BiasGELU", "ClippedLog", "GELU", "LinearGELU"]
