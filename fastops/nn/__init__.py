"""nn.Module wrappers of the fastops ops."""

from fastops.nn.clipped_log import ClippedLog
from fastops.nn.depthwise_conv2d import DepthwiseConv2d, DepthwiseSeparableConv2d
from fastops.nn.gelu import GELU, BiasGELU, LinearGELU

__all__ = ["BiasGELU", "ClippedLog", "DepthwiseConv2d", "DepthwiseSeparableConv2d", "GELU", "LinearGELU"]
