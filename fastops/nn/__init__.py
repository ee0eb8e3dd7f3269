"""nn.Module wrappers of the fastops ops; each module file also registers its swap rule."""

from fastops.nn.batch_norm import BatchNorm2d, BatchNormAct2d
from fastops.nn.clipped_log import ClippedLog
from fastops.nn.depthwise_conv2d import DepthwiseConv2d, DepthwiseConv2dSame, register_same_padding_conv2d
from fastops.nn.depthwise_separable_conv2d import DepthwiseSeparableConv2d
from fastops.nn.gelu import GELU, BiasGELU, GELUMlp, LinearGELU, PointwiseConvGELU, register_gelu_module
from fastops.nn.squeeze_excite import SqueezeExcite

__all__ = [
    "BatchNorm2d",
    "BatchNormAct2d",
    "BiasGELU",
    "ClippedLog",
    "DepthwiseConv2d",
    "DepthwiseConv2dSame",
    "DepthwiseSeparableConv2d",
    "GELU",
    "LinearGELU",
    "PointwiseConvGELU",
    "GELUMlp",
    "register_gelu_module",
    "register_same_padding_conv2d",
    "SqueezeExcite",
]
