"""fastops.nn.DepthwiseConv2d and DepthwiseSeparableConv2d: module faces of fastops.depthwise_conv2d,
parameter-for-parameter compatible with nn.Conv2d(groups=C) and with the depthwise -> 1x1 pair."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastops.ops.depthwise_conv2d import _pair, depthwise_conv2d, resolve_padding
from fastops.ops.depthwise_separable_conv2d import depthwise_separable_conv2d


def _kernel_pair(kernel_size: int | Sequence[int]) -> tuple[int, int]:
    return _pair("kernel_size", kernel_size, 1)


CUDA_BACKENDS = ("cudnn", "fastops")
# The module's CUDA default: measured on an H100 (benchmarks/results/depthwise_conv2d_cuda.md), our
# CUDA forward and input gradient are near cuDNN's in channels_last but the weight gradient is
# 0.08-0.4x, so a swapped model trained 2x slower (train_cuda.md). Until our kernel wins, CUDA input
# runs cuDNN, named as the fallback it is; FASTOPS_CUDA_DEPTHWISE=fastops runs ours.
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
        self.kernel_size = _kernel_pair(kernel_size)
        self.stride = _pair("stride", stride, 1)
        self.dilation = _pair("dilation", dilation, 1)
        self.padding: tuple[int, int] | str = (
            padding if isinstance(padding, str) else _pair("padding", padding, 0)
        )
        resolve_padding(
            self.padding, self.kernel_size, self.stride, self.dilation
        )  # validates "same"/"valid"
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
        if conv.groups != c or conv.out_channels != c:
            raise ValueError(
                "fastops.nn.DepthwiseConv2d.from_torch: expected a depthwise conv (groups == in_channels == "
                f"out_channels), got in_channels={c}, out_channels={conv.out_channels}, groups={conv.groups}"
            )
        if conv.padding_mode != "zeros":
            raise ValueError(
                "fastops.nn.DepthwiseConv2d.from_torch: only padding_mode='zeros' is supported, got "
                f"{conv.padding_mode!r}"
            )
        padding = conv.padding if isinstance(conv.padding, str) else tuple(conv.padding)
        m = cls(
            c, conv.kernel_size, conv.stride, padding, conv.dilation, conv.bias is not None, device="meta"
        )
        m.weight = conv.weight  # type: ignore[assignment]  # the same Parameter object
        m.bias = conv.bias  # type: ignore[assignment]
        return m


class DepthwiseSeparableConv2d(nn.Module):
    """``depthwise`` (fastops DepthwiseConv2d, k x k, groups=C) then ``pointwise`` (nn.Conv2d 1x1).

    State-dict keys are ``depthwise.weight``, ``depthwise.bias``, ``pointwise.weight`` and
    ``pointwise.bias`` with nn.Conv2d shapes; a state dict of ``nn.Sequential(depthwise_conv, conv1x1)``
    (keys ``0.*`` / ``1.*``) loads as well.

    Channels_last CPU input with no gradient to record (inference, ``torch.no_grad()``) runs the fused
    :func:`fastops.depthwise_separable_conv2d`: the depthwise output never goes to memory; measured
    1.16-1.69x (geomean 1.41x) faster than the pair on MobileNetV2 shapes, fp32, one thread; 1.31x
    with two (benchmarks/results/depthwise_separable_conv2d_cpu*.md). When autograd records, the pair
    runs: the fused op's backward recomputes the depthwise output, and forward+backward measured no
    faster (geomean 0.99x one thread, 0.94x two). Any other input (NCHW; CUDA, which has no fused kernel) runs the
    fastops depthwise kernel then the 1x1 through ATen (a GEMM on channels_last data): feed
    channels_last input for the fast path.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        padding: int | Sequence[int] | str = 0,
        dilation: int | Sequence[int] = 1,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.depthwise = DepthwiseConv2d(
            in_channels, kernel_size, stride, padding, dilation, bias, device=device, dtype=dtype
        )
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, bias=bias, device=device, dtype=dtype)
        self._register_load_state_dict_pre_hook(_accept_sequential_keys)

    def forward(self, x: Tensor) -> Tensor:
        dw, pw = self.depthwise, self.pointwise
        if _fusable(x, dw, pw):
            return depthwise_separable_conv2d(
                x, dw.weight, dw.bias, pw.weight, pw.bias, dw.stride, dw.padding, dw.dilation
            )
        return pw(dw(x))

    @classmethod
    def from_torch(cls, module: nn.Module) -> DepthwiseSeparableConv2d:
        """From ``nn.Sequential(depthwise nn.Conv2d, 1x1 nn.Conv2d)`` or any module with ``depthwise``
        and ``pointwise`` nn.Conv2d children, sharing their Parameter objects."""
        dw: object
        pw: object
        if isinstance(module, nn.Sequential) and len(module) == 2:
            dw, pw = module[0], module[1]
        elif hasattr(module, "depthwise") and hasattr(module, "pointwise"):
            dw, pw = module.depthwise, module.pointwise
        else:
            raise TypeError(
                "fastops.nn.DepthwiseSeparableConv2d.from_torch: expected nn.Sequential(depthwise conv, 1x1 conv) "
                f"or a module with .depthwise and .pointwise, got {type(module).__name__}"
            )
        if not isinstance(pw, nn.Conv2d) or pw.kernel_size != (1, 1) or pw.groups != 1:
            raise ValueError(
                "fastops.nn.DepthwiseSeparableConv2d.from_torch: expected the pointwise conv to be a 1x1 nn.Conv2d"
            )
        if not isinstance(dw, (DepthwiseConv2d, nn.Conv2d)):
            raise TypeError(
                "fastops.nn.DepthwiseSeparableConv2d.from_torch: expected the depthwise conv to be an nn.Conv2d, "
                f"got {type(dw).__name__}"
            )
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m.depthwise = dw if isinstance(dw, DepthwiseConv2d) else DepthwiseConv2d.from_torch(dw)
        m.pointwise = pw
        m._register_load_state_dict_pre_hook(_accept_sequential_keys)
        return m


def _fusable(x: Tensor, dw: nn.Module, pw: nn.Module) -> bool:
    """Whether the fused CPU kernel computes exactly what ``pw(dw(x))`` would: channels_last CPU input
    (the layout the kernel is fast in; fastops.depthwise_conv2d's rule for "channels_last"), a plain
    1x1 nn.Conv2d with nothing that its own forward or hooks would add; and only when no gradient is
    recorded (in training the recompute in the fused op's backward costs more than the fusion saves)."""
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in (*dw.parameters(), *pw.parameters()))
    )
    return (
        not needs_grad
        and isinstance(x, Tensor)
        and x.device.type == "cpu"
        and x.dim() == 4
        and not x.is_contiguous()
        and x.is_contiguous(memory_format=torch.channels_last)
        and type(dw) is DepthwiseConv2d
        and type(pw) is nn.Conv2d
        and pw.kernel_size == (1, 1)
        and pw.stride == (1, 1)
        and pw.dilation == (1, 1)
        and pw.groups == 1
        and pw.padding in ((0, 0), "valid")
        and pw.padding_mode == "zeros"
        and not (dw._forward_hooks or dw._forward_pre_hooks or pw._forward_hooks or pw._forward_pre_hooks)
    )


def _accept_sequential_keys(state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    # nn.Sequential(dw, pw) saves "0.weight", "1.weight", ...: map them onto our submodule names.
    for old, new in (("0.", "depthwise."), ("1.", "pointwise.")):
        for key in [k for k in state_dict if k.startswith(prefix + old)]:
            state_dict[prefix + new + key[len(prefix + old) :]] = state_dict.pop(key)
