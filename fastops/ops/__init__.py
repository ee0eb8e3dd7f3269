"""Public functions of every op, with their fake kernels, autograd and autocast rules."""

from fastops.ops.batch_norm import batch_norm
from fastops.ops.clipped_log import clipped_log
from fastops.ops.depthwise_conv2d import depthwise_conv2d
from fastops.ops.depthwise_separable_conv2d import depthwise_separable_conv2d
from fastops.ops.fused_adam import fused_adam
from fastops.ops.gelu import bias_gelu, gelu
from fastops.ops.squeeze_excite import squeeze_excite

__all__ = [
    "batch_norm",
    "bias_gelu",
    "clipped_log",
    "depthwise_conv2d",
    "depthwise_separable_conv2d",
    "fused_adam",
    "gelu",
    "squeeze_excite",
]
