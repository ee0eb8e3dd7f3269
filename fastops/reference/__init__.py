"""Plain-PyTorch definitions of every op: what tests, benchmarks and docs compare against."""

from fastops.reference.batch_norm import batch_norm
from fastops.reference.clipped_log import clipped_log
from fastops.reference.depthwise_conv2d import depthwise_conv2d
from fastops.reference.depthwise_separable_conv2d import depthwise_separable_conv2d
from fastops.reference.fused_adam import adam_step
from fastops.reference.gelu import bias_gelu, gelu
from fastops.reference.squeeze_excite import squeeze_excite

__all__ = [
    "adam_step",
    "batch_norm",
    "bias_gelu",
    "clipped_log",
    "depthwise_conv2d",
    "depthwise_separable_conv2d",
    "gelu",
    "squeeze_excite",
]
