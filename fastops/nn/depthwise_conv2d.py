"""fastops.nn.DepthwiseConv2d: the module face of fastops.depthwise_conv2d, parameter-for-parameter
compatible with nn.Conv2d(groups=C); DepthwiseConv2dSame, its TensorFlow-"same"-padding form (timm's
Conv2dSame); and the swap rule for depthwise nn.Conv2d and its subclasses."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastops import policy
from fastops.nn._twin import forward_mismatch, refuse_script, share_parameters
from fastops.ops._validate import int_pair, resolve_padding
from fastops.ops.depthwise_conv2d import depthwise_conv2d
from fastops.swap import SwapRule, class_path, overrides, register_swap_rule

# nn.Conv2d subclasses whose forward zero-pads TensorFlow "same" for each input size and then runs
# F.conv2d without padding (timm's Conv2dSame). Class paths, so timm need not be imported.
_SAME_PADDING_CONV2D: set[str] = {"timm.layers.conv2d_same.Conv2dSame"}


def register_same_padding_conv2d(cls: type[nn.Conv2d] | str) -> None:
    """Declare that convs of exactly this ``nn.Conv2d`` subclass compute
    ``F.conv2d(F.pad(x, tf_same_padding(...)), weight, bias, stride, 0, dilation, groups)`` as timm's
    ``Conv2dSame`` does, so :func:`fastops.swap_modules` turns the depthwise ones into
    :class:`DepthwiseConv2dSame`. ``cls`` is the class or its path ``"package.module.Class"``. The
    swap still checks the claim on probe inputs, and skips, with the reason, a conv that does not
    keep it. Built in: timm's ``Conv2dSame``."""
    path = cls if isinstance(cls, str) else class_path(cls) if isinstance(cls, type) else None
    if not isinstance(path, str) or "." not in path:
        raise TypeError(
            "fastops.nn.register_same_padding_conv2d: expected cls to be an nn.Conv2d subclass or a "
            f"'package.module.Class' path, got {cls!r}"
        )
    _SAME_PADDING_CONV2D.add(path)


def tf_same_padding(
    size: Sequence[int], kernel_size: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]
) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) zero padding of TensorFlow's "same" for an input of ``size`` (h, w):
    the output has ceil(size / stride) rows and columns, and the odd extra zero goes bottom/right."""
    pads = []
    for extent, k, s, d in zip(size, kernel_size, stride, dilation, strict=True):
        total = max((-(-extent // s) - 1) * s + (k - 1) * d + 1 - extent, 0)
        pads += [total // 2, total - total // 2]
    return (pads[0], pads[1], pads[2], pads[3])


_OP = "depthwise_conv2d"  # argument errors name the op the module runs


def _unbatched(x: object) -> bool:
    """An unbatched (C, H, W) input, which nn.Conv2d takes: the modules run it as a batch of one
    (the kernels, and the policy's shape rules, are for (N, C, H, W))."""
    return isinstance(x, Tensor) and x.dim() == 3


CUDA_BACKENDS = ("auto", "cudnn", "fastops")
# The module's CUDA default, "auto": cuDNN (F.conv2d, named as the fallback it is) except where a GPU
# run measured our kernels faster, forward and backward together: the CUDA region registered below.
# "fastops" runs ours on every CUDA input, "cudnn" cuDNN on every one.
DEFAULT_CUDA_BACKEND = "auto"


def cuda_backend() -> str:
    """Which kernel ``DepthwiseConv2d`` modules run on CUDA input: FASTOPS_CUDA_DEPTHWISE, else the
    default. ``"auto"``: ours where the benchmarks show it faster, else ``F.conv2d``; ``"fastops"``:
    fastops' CUDA kernels; ``"cudnn"``: ``F.conv2d`` (a fallback to PyTorch)."""
    chosen = os.environ.get("FASTOPS_CUDA_DEPTHWISE", "").strip().lower() or DEFAULT_CUDA_BACKEND
    if chosen not in CUDA_BACKENDS:
        raise ValueError(
            f"fastops.nn.DepthwiseConv2d: FASTOPS_CUDA_DEPTHWISE={chosen!r}; expected one of {CUDA_BACKENDS}"
        )
    return chosen


class DepthwiseConv2d(nn.Conv2d):
    """``nn.Conv2d(channels, channels, kernel_size, stride, padding, dilation, groups=channels, bias=bias)``
    on fastops kernels. An ``nn.Conv2d`` subclass with its attributes (``in_channels``,
    ``out_channels``, ``groups``, ``padding_mode``, ...), so code that finds convs by ``isinstance``
    still finds it; its parameters ``weight`` (C, 1, kh, kw) and ``bias`` (C,) are nn.Conv2d's, so
    state dicts load both ways; see :func:`fastops.depthwise_conv2d`.

    CUDA input runs the kernel named by ``cuda_backend`` (``None``: :func:`cuda_backend`, which is
    ``"auto"`` unless FASTOPS_CUDA_DEPTHWISE says otherwise): under ``"auto"``, ours for float32
    channels_last input with a 7x7 kernel at stride 1, dilation 1 (ConvNeXt's, where the H200 measured
    it 3.5x cuDNN forward and backward), cuDNN through ``F.conv2d`` (a fallback) for every other CUDA
    input, where cuDNN is still faster. ``"fastops"`` runs ours on every CUDA input, ``"cudnn"``
    cuDNN. Under ``"auto"``, on either device, ``backend`` (``"auto"``, ``"fastops"`` or
    ``"torch"``) picks the kernel as :mod:`fastops.policy` says: ``F.conv2d`` runs for the inputs
    where the benchmarks show it faster than ours.
    """

    __prepare_scriptable__ = refuse_script  # torch.jit.script: a clear refusal

    cuda_backend: str | None = None
    backend: str = "auto"
    policy_ops = ("depthwise_conv2d",)  # the ops whose fastops.policy regions this module follows

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
        if isinstance(channels, bool) or not isinstance(channels, int) or channels < 1:
            raise ValueError(
                f"fastops.nn.DepthwiseConv2d: expected channels to be an int >= 1, got {channels!r}"
            )
        # Checked here first, so that a bad argument is named as fastops names it.
        kernel = int_pair(_OP, "kernel_size", kernel_size, 1)
        strides = int_pair(_OP, "stride", stride, 1)
        dilations = int_pair(_OP, "dilation", dilation, 1)
        pads = padding if isinstance(padding, str) else int_pair(_OP, "padding", padding, 0)
        resolve_padding(_OP, pads, kernel, strides, dilations)  # validates "same"
        # nn.Conv2d's constructor: its attributes, and its initialization of weight and bias.
        super().__init__(
            channels, channels, kernel, strides, pads, dilations, channels, bias, "zeros", device, dtype
        )
        self.channels = channels
        self.kernel_size: tuple[int, int] = kernel
        self.stride: tuple[int, int] = strides
        self.dilation: tuple[int, int] = dilations
        self.padding: tuple[int, int] | str = pads

    def forward(self, x: Tensor) -> Tensor:
        if _unbatched(x):
            return self.forward(x.unsqueeze(0)).squeeze(0)
        if self._runs_torch(x):
            return F.conv2d(
                x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.channels
            )
        return depthwise_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)

    def _runs_torch(self, x: Tensor) -> bool:
        """Whether this input goes to ``F.conv2d``: on CUDA as ``cuda_backend`` says, and where that
        is ``"auto"`` (and on the CPU) as :mod:`fastops.policy` says (a measured slower region)."""
        if isinstance(x, Tensor) and x.is_cuda:
            chosen = self.resolved_cuda_backend()
            if chosen != "auto":
                return chosen == "cudnn"
        return policy.runs_torch(
            self, _OP, x, kernel_size=self.kernel_size, stride=self.stride, dilation=self.dilation
        )

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
        if _same_padding_class(conv):
            reason: str | None = (
                "it pads TensorFlow 'same' for each input size: use fastops.nn.DepthwiseConv2dSame"
            )
        else:
            reason = _skip_reason(conv)
        if reason is not None:
            raise ValueError(f"fastops.nn.DepthwiseConv2d.from_torch: {reason}")
        padding = conv.padding if isinstance(conv.padding, str) else tuple(conv.padding)
        m = cls(
            c, conv.kernel_size, conv.stride, padding, conv.dilation, conv.bias is not None, device="meta"
        )
        share_parameters(m, conv)
        return m


class DepthwiseConv2dSame(DepthwiseConv2d):
    """A depthwise conv with TensorFlow "same" zero padding, recomputed for each input size (timm's
    ``Conv2dSame``): the output has ``ceil(H / stride)`` x ``ceil(W / stride)`` pixels and an odd extra
    zero goes to the bottom/right. The padding goes straight to the kernel as four ints (top, bottom,
    left, right), so no padded copy of the input is made. Parameters and state_dict keys are
    nn.Conv2d's."""

    def __init__(
        self,
        channels: int,
        kernel_size: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        dilation: int | Sequence[int] = 1,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(channels, kernel_size, stride, 0, dilation, bias, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        if _unbatched(x):
            return self.forward(x.unsqueeze(0)).squeeze(0)
        if not (isinstance(x, Tensor) and x.dim() == 4):  # depthwise_conv2d names what was expected
            return depthwise_conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation)
        top, bottom, left, right = tf_same_padding(x.shape[2:], self.kernel_size, self.stride, self.dilation)
        if self._runs_torch(x):
            padded = F.pad(x, (left, right, top, bottom))
            return F.conv2d(padded, self.weight, self.bias, self.stride, 0, self.dilation, self.channels)
        return depthwise_conv2d(
            x, self.weight, self.bias, self.stride, (top, bottom, left, right), self.dilation
        )

    def extra_repr(self) -> str:
        return super().extra_repr().replace(f"padding={self.padding}", "padding='tf_same'")

    @classmethod
    def from_torch(cls, conv: nn.Conv2d) -> DepthwiseConv2dSame:  # type: ignore[override]
        """The TensorFlow-"same" depthwise conv of ``conv``'s weights, stride and dilation (a timm
        ``Conv2dSame``, or any depthwise nn.Conv2d: its own padding is not used), sharing its
        Parameter objects."""
        if not isinstance(conv, nn.Conv2d) or not (conv.groups == conv.in_channels == conv.out_channels):
            raise TypeError(
                "fastops.nn.DepthwiseConv2dSame.from_torch: expected a depthwise nn.Conv2d (groups == "
                f"in_channels == out_channels), got {class_path(type(conv))}"
            )
        m = cls(
            conv.in_channels,
            conv.kernel_size,
            conv.stride,
            conv.dilation,
            conv.bias is not None,
            device="meta",
        )
        share_parameters(m, conv)
        return m


def _is_depthwise(m: nn.Module) -> bool:
    # Subclasses too: their forward is checked in _skip_reason, and they are reported if skipped;
    # not fastops' own modules (DepthwiseConv2d, PointwiseConvGELU), nn.Conv2d subclasses as well.
    return (
        isinstance(m, nn.Conv2d)
        and not type(m).__module__.startswith("fastops.")
        and m.groups == m.in_channels == m.out_channels
    )


def _same_padding_class(conv: nn.Conv2d) -> bool:
    return class_path(type(conv)) in _SAME_PADDING_CONV2D


def _skip_reason(conv: nn.Conv2d) -> str | None:
    if _same_padding_class(conv):
        return _same_padding_mismatch(conv)
    changed = overrides(type(conv), nn.Conv2d, "forward", "_conv_forward")
    if changed:
        return (
            f"subclass of nn.Conv2d overrides {', '.join(changed)}(), so the swap cannot prove it "
            "equivalent (a conv with TensorFlow 'same' padding: fastops.nn.register_same_padding_conv2d)"
        )
    if conv.padding_mode != "zeros":
        return f"only padding_mode='zeros' is supported, got {conv.padding_mode!r}"
    return None


def _same_padding_mismatch(conv: nn.Conv2d) -> str | None:
    """Check a registered TF-"same" conv on inputs of both parities of size (the padding differs)."""
    k = conv.kernel_size
    span = max(k[0] * conv.dilation[0], k[1] * conv.dilation[1])
    shapes = [(1, conv.in_channels, span + extra, span + extra + 1) for extra in (1, 2)]
    stride, dilation = (
        (int(conv.stride[0]), int(conv.stride[1])),
        (int(conv.dilation[0]), int(conv.dilation[1])),
    )

    def tf_same(x: Tensor) -> Tensor:
        top, bottom, left, right = tf_same_padding(x.shape[2:], (k[0], k[1]), stride, dilation)
        padded = F.pad(x, (left, right, top, bottom))
        return F.conv2d(padded, conv.weight, conv.bias, stride, 0, dilation, conv.groups)

    reason = forward_mismatch(conv, tf_same, shapes, conv.weight.device, conv.weight.dtype)
    return None if reason is None else f"registered as a TensorFlow 'same' conv, but {reason}"


def _replace(conv: nn.Conv2d) -> DepthwiseConv2d:
    return (
        DepthwiseConv2dSame.from_torch(conv)
        if _same_padding_class(conv)
        else DepthwiseConv2d.from_torch(conv)
    )


register_swap_rule(
    SwapRule("depthwise_conv2d", matches=_is_depthwise, replace=_replace, skip_reason=_skip_reason)
)


# Where F.conv2d (oneDNN) beats our CPU kernels: fastops.policy sends those calls to it. From
# benchmarks/bench_swap_policy.py, 1 thread, batch 16, the MobileNetV2 / ConvNeXt-atto layer shapes
# (channels_last: thread CPU time, --thread-time).
_CL_AVX512 = "benchmarks/results/swap_policy_cpu_dw_cl_threads1.md"
_CL_AVX2 = "benchmarks/results/swap_policy_cpu_dw_cl_avx2_threads1.md"
# NCHW fp32 since the channel-blocked kernels (two runs per ISA, thread time; the table and the runs).
_NCHW_BLOCKED = "benchmarks/results/depthwise_conv2d_cpu_nchw_blocked.md"
# The main job's own ConvNet (digits: 16x16 input, 32-128 channels, batch 64), both layouts.
_DIGITS_AVX512 = "benchmarks/results/swap_policy_cpu_dw_digits_threads1.md"
_DIGITS_AVX2 = "benchmarks/results/swap_policy_cpu_dw_digits_avx2_threads1.md"
# NCHW fp32 after the register path for 3x3 kernels on rows to 16 wide (stride 1; 2026-11-28).
_NCHW_REGISTER = "benchmarks/results/swap_policy_cpu_dw_nchw_register_threads1.md"
# channels_last bf16 training after the one-instruction bf16 stores (2026-11-28; a recheck beside it).
_CL_BF16_TRAIN = "benchmarks/results/swap_policy_cpu_dw_cl_bf16_train_threads1.md"
# NCHW bf16 through the fp32 paths (Zen 5 host, 2026-11-28; AVX2: 5.67x torch at least, no region).
_NCHW_BF16 = "benchmarks/results/swap_policy_cpu_dw_nchw_bf16_half_zen5_threads1.md"
# NCHW fp32 after static_for_inlined (the channel-blocked rows' accumulators in registers; Zen 5 host).
_NCHW_INLINED_AVX2 = "benchmarks/results/swap_policy_cpu_dw_nchw_inlined_avx2_zen5_threads1.md"
# channels_last fp32 strided 3x3 layers on the Zen 5 host, batch 16 and 32 (2026-11-28).
_CL_STRIDED = "benchmarks/results/swap_policy_cpu_dw_cl_s2_b16_zen5_threads1.md"
_CL_STRIDED_B32 = "benchmarks/results/swap_policy_cpu_dw_cl_s2_b32_zen5_threads1.md"


def _out_side(case: policy.Case) -> int:
    """The larger side of the output map (padding as "same" would give)."""
    stride = case.params["stride"]
    assert isinstance(stride, tuple)
    return max(-(-case.shape[2] // stride[0]), -(-case.shape[3] // stride[1]))


def _in_side(case: policy.Case) -> int:
    """The larger side of the input map."""
    return max(case.shape[2], case.shape[3])


def _kernel(case: policy.Case) -> int:
    kernel = case.params["kernel_size"]
    assert isinstance(kernel, tuple)
    return max(kernel)


def _kernel_hw(case: policy.Case) -> tuple[int, int]:
    kernel = case.params["kernel_size"]
    assert isinstance(kernel, tuple)
    return kernel


def _channels(case: policy.Case) -> int:
    return case.shape[1]


def _strided(case: policy.Case) -> bool:
    stride = case.params["stride"]
    assert isinstance(stride, tuple)
    return max(stride) > 1


def _slower(
    isa: str,
    channels_last: bool,
    dtype: torch.dtype,
    backward: bool,
    what: str,
    evidence: str,
    when: Callable[[policy.Case], bool],
) -> None:
    layout = "channels_last" if channels_last else "NCHW"
    policy.register_slower_region(
        policy.SlowerRegion(
            _OP,
            "cpu",
            f"{isa} {layout} {str(dtype).removeprefix('torch.')} {'training' if backward else 'inference'}, {what}",
            evidence,
            when,
            isas=(isa,),
            channels_last=channels_last,
            dtypes=(dtype,),
            backward=backward,
        )
    )


_fp32, _bf16 = torch.float32, torch.bfloat16
# fmt: off
# (ISA, channels_last, dtype, training, the region in words, what was measured there, the region)
for _region in [
    # 3x3 stride 1 at 8x8 to 14x14 left both regions with the register path (c384.14 1.28x / 1.49x, c576.14 1.68x / 1.75x).
    ("avx512", False, _fp32, False, "5x5 kernels to outputs 14x14 (not measured)", f"{_NCHW_BLOCKED} (3x3 since: {_NCHW_REGISTER})", lambda c: 3 < _kernel(c) <= 5 and _out_side(c) <= 14),
    ("avx512", False, _fp32, True, "5x5 kernels to outputs 14x14 (not measured)", f"{_NCHW_BLOCKED} (3x3 since: {_NCHW_REGISTER})", lambda c: 3 < _kernel(c) <= 5 and _out_side(c) <= 14),
    # NCHW bf16 since it runs the fp32 paths through widened chunks (before: ours 0.27-0.98x on every
    # map to 28x28 and strided inference, 0.31-0.69x with 7x7 kernels: swap_policy_cpu_dw_nchw_threads1.md). The digits
    # layers, 7x7 maps, strided maps from 56x56 and 14x14/28x28 7x7 layers are ours now (1.08-1.55x).
    ("avx512", False, _bf16, False, "kernels to 5x5, stride 1, outputs 14x14 to 28x28, over 128 channels", f"{_NCHW_BF16}: 0.91-1.00x", lambda c: _kernel(c) <= 5 and not _strided(c) and 14 <= _out_side(c) <= 28 and _channels(c) > 128),
    ("avx512", False, _bf16, False, "kernels to 5x5, strided, inputs 17x17 to 28x28", f"{_NCHW_BF16}: 0.94x", lambda c: _kernel(c) <= 5 and _strided(c) and 16 < _in_side(c) <= 28),
    ("avx512", False, _bf16, False, "kernels over 5x5, outputs to 7x7 or from 56x56", f"{_NCHW_BF16}: 0.89x, 0.97x", lambda c: _kernel(c) > 5 and not 7 < _out_side(c) < 56),
    ("avx512", False, _bf16, True, "kernels to 5x5, stride 1, outputs 14x14 to 28x28, over 128 channels", f"{_NCHW_BF16}: 0.93-0.95x", lambda c: _kernel(c) <= 5 and not _strided(c) and 14 <= _out_side(c) <= 28 and _channels(c) > 128),
    ("avx2", False, _fp32, False, "kernels over 5x5, outputs to 14x14", f"{_NCHW_BLOCKED}: 0.79-0.96x (one 1.12x); {_NCHW_INLINED_AVX2}: 0.92-0.93x", lambda c: _kernel(c) > 5 and _out_side(c) <= 14),
    # AVX-512 NCHW fp32 inference with 7x7 kernels to 14x14 outputs (0.76-0.96x) and the digits
    # ConvNet's strided 3x3 layer on 8x8 maps (0.80x, swap_policy_cpu_dw_digits_nchw_register_strided_
    # threads1.md) left oneDNN once the channel-blocked rows kept their accumulators in registers
    # (static_for_inlined; swap_policy_cpu_dw_nchw_inlined_zen5_threads1.md: 1.11x, 1.06x, 1.76x; ours
    # at 1.03x or more on all 38 rows).
    # Its stride-1 layers to 4x4 had left with the register path, its strided ones from 16x16 with the
    # strided register path, its strided training with plain-vector stores.
    # channels_last: only the kernel sizes measured (3x3, 7x7; 5x5 runs ours), except bf16 inference
    # on AVX-512, where oneDNN's bf16 kernel wins at every size and kernel.
    ("avx512", True, _fp32, False, "3x3 kernels, outputs to 16x16", f"{_CL_AVX512}: 0.70-0.97x; {_DIGITS_AVX512}: 0.64-0.71x", lambda c: _kernel(c) <= 3 and _out_side(c) <= 16),
    ("avx512", True, _fp32, False, "kernels over 5x5, outputs to 56x56", f"{_CL_AVX512}: 0.72-0.80x", lambda c: _kernel(c) > 5 and _out_side(c) <= 56),
    ("avx512", True, _fp32, True, "3x3 kernels, outputs to 16x16", f"{_CL_AVX512}: 0.73-0.94x; {_DIGITS_AVX512}: 0.69-0.82x", lambda c: _kernel(c) <= 3 and _out_side(c) <= 16),
    # Strided 3x3 channels_last fp32 at larger outputs: 1.01x on the host of _CL_AVX512, 0.66-0.94x on a Zen 5.
    ("avx512", True, _fp32, False, "3x3 kernels, strided", f"{_CL_STRIDED}: 0.66x, 0.71x (outputs 56x56, 28x28); {_CL_STRIDED_B32}: 0.67x, 0.72x", lambda c: _kernel(c) <= 3 and _strided(c)),
    ("avx512", True, _fp32, True, "3x3 kernels, strided", f"{_CL_STRIDED}: 0.88x, 0.94x (outputs 56x56, 28x28); {_CL_STRIDED_B32}: 0.94x, 0.91x", lambda c: _kernel(c) <= 3 and _strided(c)),
    ("avx512", True, _bf16, False, "every size", f"{_CL_AVX512}: 0.55-0.81x", lambda c: True),
    ("avx512", True, _bf16, True, "3x3 kernels, stride 1, outputs to 28x28, over 128 channels", f"{_CL_AVX512}: 0.57-0.91x; {_CL_BF16_TRAIN}: 192-960 channels 0.66-0.88x, the digits layers (32-128 channels) ours at 1.12-1.18x", lambda c: _kernel(c) <= 3 and not _strided(c) and _out_side(c) <= 28 and _channels(c) > 128),
    ("avx2", True, _fp32, False, "3x3 kernels, inputs from 28x28", f"{_CL_AVX2}: 0.66-0.98x", lambda c: _kernel(c) <= 3 and _in_side(c) >= 28),
    ("avx2", True, _fp32, False, "kernels over 5x5, outputs to 7x7", f"{_CL_AVX2}: 0.85x", lambda c: _kernel(c) > 5 and _out_side(c) <= 7),
    ("avx2", True, _fp32, True, "3x3 kernels, strided, or outputs to 7x7 or from 28x28", f"{_CL_AVX2}: 0.59-0.98x (one 1.04x)", lambda c: _kernel(c) <= 3 and (_strided(c) or not 7 < _out_side(c) < 28)),
    ("avx2", True, _fp32, False, "3x3 kernels to 64 channels with outputs 4x4 to 16x16, or outputs to 4x4", f"{_DIGITS_AVX2}: 0.73-0.90x", lambda c: _kernel(c) <= 3 and ((_channels(c) <= 64 and 4 <= _out_side(c) <= 16) or _out_side(c) <= 4)),
    ("avx2", True, _fp32, True, "3x3 kernels to 64 channels, stride 1, outputs 8x8 to 16x16", f"{_DIGITS_AVX2}: 0.58-0.63x", lambda c: _kernel(c) <= 3 and _channels(c) <= 64 and 8 <= _out_side(c) <= 16),
]:
    _slower(*_region)
# fmt: on

# CUDA, under cuda_backend "auto": cuDNN wherever our kernels are not measured faster forward and
# backward together. The H200 run of 2026-11-27 (b256): NCHW 0.34-0.48x; channels_last 3x3 fp32
# 0.76-0.86x and bf16 0.77-0.80x (wgrad 0.50-0.92x, stride-2 dgrad 0.72x), but 7x7 fp32 3.53x, where
# cuDNN's NHWC weight gradient takes 4.6 ms against our 0.89 ms. cuDNN's bf16 7x7 weight gradient
# is fast (0.37 ms on the H100, 2026-11-24), so bf16 and fp16 stay on cuDNN until measured.
_H200_DW = "benchmarks/results/gpu_h200_2026-11-27b.md"


def _cuda_measured_faster(case: policy.Case) -> bool:
    """The one CUDA case measured faster than cuDNN: float32 channels_last 7x7, stride 1, dilation 1,
    whole 16-byte channel vectors (what our channels_last kernels take; other kernel sizes, dilations
    and channel counts run older, slower kernels)."""
    return (
        case.channels_last
        and case.dtype == torch.float32
        and _kernel_hw(case) == (7, 7)
        and not _strided(case)
        and case.params.get("dilation", (1, 1)) == (1, 1)
        and _channels(case) % 4 == 0
    )


policy.register_slower_region(
    policy.SlowerRegion(
        _OP,
        "cuda",
        "every input but float32 channels_last 7x7 at stride 1, dilation 1, channels a multiple of 4",
        f"{_H200_DW}: fwd+bwd NCHW 0.34-0.48x cuDNN, channels_last 3x3 0.76-0.86x (fp32) and "
        "0.77-0.80x (bf16); channels_last 7x7 fp32 3.53x (cnxa.c40.56), so that one runs ours",
        lambda c: not _cuda_measured_faster(c),
    )
)
