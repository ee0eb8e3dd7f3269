"""fastops: fused training ops for PyTorch, as C++/CUDA kernels registered under torch.ops.fastops.

Public API:
  batch_norm                      F.batch_norm: one statistics + normalisation pass, one backward pass
  clipped_log                     log(clamp(x, eps)) with a straight-through gradient
  depthwise_conv2d                F.conv2d(groups=C), NCHW and channels_last kernels, both backwards
  depthwise_separable_conv2d      depthwise conv + 1x1 conv fused on the CPU (channels_last tiles)
  gelu, bias_gelu                 GELU (erf or tanh form), optionally fused with a bias add
  squeeze_excite                  squeeze-excitation block: fused pool / scale passes, one-pass backward
  swap_modules                    swap GELUs, BatchNorm2d, depthwise convs, Linear->GELU and Mlp blocks (timm's too) for fastops modules
  register_swap_rule              teach swap_modules a rule of your own (SwapRule, PairRule)
  tune                            measure each swapped module's kernel choice ahead of a run (fastops.tuner)
  fastops.train                   training loop (AMP, checkpointing, DDP) and the main job (`python -m fastops.train`)
  fastops.nn                      nn.Module wrappers of every op
  fastops.optim                   FusedAdam / FusedAdamW (drop-ins for torch.optim.Adam / AdamW)
  fastops.reference               plain-PyTorch definitions of every op
"""

import sys

from fastops import _env, _extension

try:
    _env.check()  # a bad FASTOPS_* value is an error now, before any work
except ValueError as error:
    # `python -m fastops.<command>` imports this package before the command reads its arguments
    # (sys.argv[0] is "-m" only while Python looks for the command): a usage error, as argparse
    # gives, exit status 2 with the one line and no traceback.
    if sys.argv[:1] == ["-m"]:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    raise
_extension.load()

from fastops import nn, ops, optim, reference  # noqa: E402
from fastops._version import __version__  # noqa: E402
from fastops.ops.batch_norm import batch_norm  # noqa: E402
from fastops.ops.clipped_log import clipped_log  # noqa: E402
from fastops.ops.depthwise_conv2d import depthwise_conv2d  # noqa: E402
from fastops.ops.depthwise_separable_conv2d import depthwise_separable_conv2d  # noqa: E402
from fastops.ops.gelu import bias_gelu, gelu  # noqa: E402
from fastops.ops.squeeze_excite import squeeze_excite  # noqa: E402
from fastops.swap import swap_modules  # noqa: E402
from fastops.swap_rules import PairRule, SwapRule, register_swap_rule  # noqa: E402
from fastops.tuner import tune  # noqa: E402

__all__ = [
    "__version__",
    "batch_norm",
    "bias_gelu",
    "clipped_log",
    "depthwise_conv2d",
    "depthwise_separable_conv2d",
    "gelu",
    "nn",
    "ops",
    "optim",
    "reference",
    "squeeze_excite",
    "register_swap_rule",
    "swap_modules",
    "tune",
    "PairRule",
    "SwapRule",
]
