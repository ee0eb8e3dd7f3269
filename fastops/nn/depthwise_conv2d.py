"""fastops.nn.DepthwiseConv2d: the module face of fastops.depthwise_conv2d, parameter-for-parameter
compatible with nn.Conv2d(groups=C), and its swap rule for depthwise nn.Conv2d."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastops.nn._twin import share_parameters
from fastops.ops._validate import int_pair, resolve_padding
from fastops.ops.depthwise_conv2d import depthwise_conv2d
from fastops.swap import SwapRule, register_swap_rule

_OP = "depthwise_conv2d"  # argument errors name the op the module runs


CUDA_BACKENDS = ("cudnn", "fastops")
# The module's CUDA default: our CUDA weight gradient is still far slower than cuDNN's, so swapped
# models trained slower than stock (benchmarks/results/depthwise_conv2d_cuda.md, train_cuda.md).
# Until our kernel wins, CUDA input runs cuDNN, named as the fallback it is;
# FASTOPS_CUDA_DEPTHWISE=fastops runs ours.
DEFAULT_CUDA_BACKEND = "cudnn"


def cuda_backend() -> str:
    """Which kernel ``DepthwiseConv2d`` modules run on CUDA input: FASTOPS_CUDA_DEPTHWISE, else the
    default. ``"fastops"``: fastops' CUDA kernels; ``"cudnn"``: ``F.conv2d`` (a fallback to PyTorch)."""
    chosen = os.environ.get("FASTOPS_CUDA_DEPTHWISE", "").strip().lower() or DEFAULT_CUDA_BACKEND
    if chosen not in CUDA_BACKENDS:
        raise ValueError(
            f"fastops.nn.DepthwiseConv2d: FASTOPS_CUDA_DEPTHWISE={chosen!r}; expected one of {CUDA_BACKENDS}"
        )
    return chosen


class DepthwiseConv2d(nn.Module):
    """``nn.Conv2d(channels, channels, kernel_size, stride, padding, dilation, groups=channels, bias=bias)``
    on fastops kernels. Parameters ``weight`` (C, 1, kh, kw) and ``bias`` (C,) are named, shaped and
    initialized as nn.Conv2d's, so state dicts load both ways; see :func:`fastops.depthwise_conv2d`.

    CUDA input runs the kernel named by ``cuda_backend`` (``None``: :func:`cuda_backend`, which is
    ``"cudnn"``, a fallback to ``F.conv2d``, unless FASTOPS_CUDA_DEPTHWISE=fastops): fastops' CUDA
    weight gradient is still slower than cuDNN's. Set ``module.cuda_backend = "fastops"`` to run ours.
    """

    cuda_backend: str | None = None

    def __init__(
        self,
        channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | str = 0,
        dilation: int | Sequence[int] = 1,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise ValueError(
                f"fastops.nn.DepthwiseConv2d: expected channels to be an int >= 1, got {channels!r}"
            )
        self.channels = channels
        self.kernel_size = int_pair(_OP, "kernel_size", kernel_size, 1)
        self.stride = int_pair(_OP, "stride", stride, 1)
        self.dilation = int_pair(_OP, "dilation", dilation, 1)
        self.padding: tuple[int, int] | str = (
            padding if isinstance(padding, str) else int_pair(_OP, "padding", padding, 0)
        )
        resolve_padding(_OP, self.padding, self.kernel_size, self.stride, self.dilation)  # validates "same"
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(channels, 1, *self.kernel_size, **factory))
        self.bias = nn.Parameter(torch.empty(channels, **factory)) if bias else None
        if not self.weight.is_meta:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Conv2d's initialization, so a fresh module draws from the same distribution.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.kernel_size[0] * self.kernel_size[1])
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        if isinstance(x, Tensor) and x.is_cuda and self.resolved_cuda_backend() == "cudnn":
            return F.conv2d(
                x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.channels
            )
        return depthwise_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)

    def resolved_cuda_backend(self) -> str:
        """The kernel this module runs on CUDA input: its ``cuda_backend``, else :func:`cuda_backend`."""
        if self.cuda_backend is None:
            return cuda_backend()
        if self.cuda_backend not in CUDA_BACKENDS:
            raise ValueError(
                f"fastops.nn.DepthwiseConv2d: cuda_backend={self.cuda_backend!r}; expected one of "
                f"{CUDA_BACKENDS} or None"
            )
        return self.cuda_backend

    def extra_repr(self) -> str:
        s = f"{self.channels}, kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        return s + ("" if self.bias is not None else ", bias=False")

    @classmethod
    def from_torch(cls, conv: nn.Conv2d) -> DepthwiseConv2d:
        """The same convolution on fastops kernels, sharing ``conv``'s Parameter objects."""
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(
                f"fastops.nn.DepthwiseConv2d.from_torch: expected an nn.Conv2d, got {type(conv).__name__}"
            )
        c = conv.in_channels
        if not (conv.groups == c == conv.out_channels):
            raise ValueError(
                "fastops.nn.DepthwiseConv2d.from_torch: expected a depthwise conv (groups == in_channels == "
                f"out_channels), got in_channels={c}, out_channels={conv.out_channels}, groups={conv.groups}"
            )
        reason = _skip_reason(conv)
        if reason is not None:
            raise ValueError(f"fastops.nn.DepthwiseConv2d.from_torch: {reason}")
        padding = conv.padding if isinstance(conv.padding, str) else tuple(conv.padding)
        m = cls(
            c, conv.kernel_size, conv.stride, padding, conv.dilation, conv.bias is not None, device="meta"
        )
        share_parameters(m, conv)
        return m


def _is_depthwise(m: nn.Module) -> bool:
    # Exact type: a subclass may override forward(), which the swap would silently drop.
    return type(m) is nn.Conv2d and m.groups == m.in_channels == m.out_channels


def _skip_reason(conv: nn.Conv2d) -> str | None:
    if conv.padding_mode != "zeros":
        return f"only padding_mode='zeros' is supported, got {conv.padding_mode!r}"
    return None


register_swap_rule(
    SwapRule(
        "depthwise_conv2d",
        matches=_is_depthwise,
        replace=DepthwiseConv2d.from_torch,
        skip_reason=_skip_reason,
    )
)
