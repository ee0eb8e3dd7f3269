"""fastops.nn.DepthwiseConv2d: the module face of fastops.depthwise_conv2d, parameter-for-parameter
compatible with nn.Conv2d(groups=C); DepthwiseConv2dSame, its TensorFlow-"same"-padding form (timm's
Conv2dSame); and the swap rule for depthwise nn.Conv2d and its subclasses."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastops import policy
from fastops.nn._twin import REFUSED, forward_mismatch, share_parameters
from fastops.ops._validate import int_pair, resolve_padding
from fastops.ops.depthwise_conv2d import depthwise_conv2d
from fastops.policy import is_compiling
from fastops.swap_rules import SwapRule, class_path, overrides, register_swap_rule

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
# The registered op, which the modules call directly: its C++ kernel checks the tensors, and the
# modules hold their own hyper-parameters checked and parsed (fastops.depthwise_conv2d parses them
# per call).
_DEPTHWISE_OP = torch.ops.fastops.depthwise_conv2d.default
_RUN_DEPTHWISE = policy.compiled_runner("depthwise_conv2d")


def _unbatched(x: object) -> bool:
    """An unbatched (C, H, W) input, which nn.Conv2d takes: the modules run it as a batch of one
    (the kernels are for (N, C, H, W))."""
    return isinstance(x, Tensor) and x.dim() == 3


class DepthwiseConv2d(policy.TunedModule, nn.Conv2d):
    """``nn.Conv2d(channels, channels, kernel_size, stride, padding, dilation, groups=channels, bias=bias)``
    on fastops kernels. An ``nn.Conv2d`` subclass with its attributes (``in_channels``,
    ``out_channels``, ``groups``, ``padding_mode``, ...), so code that finds convs by ``isinstance``
    still finds it; its parameters ``weight`` (C, 1, kh, kw) and ``bias`` (C,) are nn.Conv2d's, so
    state dicts load both ways; see :func:`fastops.depthwise_conv2d`.

    ``backend`` (``"auto"``, ``"fastops"`` or ``"torch"``, on every device) picks the kernel as
    :mod:`fastops.policy` says: under ``"auto"``, ``F.conv2d`` (oneDNN, cuDNN) runs for the inputs
    where it is measured faster than ours on this machine.
    """

    policy_ops = ("depthwise_conv2d",)

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
        if not is_compiling():
            params = self._parameters  # (self.weight costs ~0.4 us a lookup, through nn.Module.__getattr__)
            try:  # ours, when chosen for this x (measured faster, or forced by backend) (unbatched x: None, never remembered)
                y = _RUN_DEPTHWISE(self, x, params["weight"], params["bias"], *self._op_args())
            except REFUSED:
                y = None  # the path below names what was wrong
            if y is not None:
                return y
        if _unbatched(x):
            return self.forward(x.unsqueeze(0)).squeeze(0)
        return super().forward(x)  # TunedModule's: ours or F.conv2d, as measured

    def fastops_details(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding!r}, dilation={self.dilation}"

    def _fastops_forward(self, x: Tensor) -> Tensor:
        params = self._parameters  # (self.weight costs ~0.4 us a lookup, through nn.Module.__getattr__)
        try:
            return _DEPTHWISE_OP(x, params["weight"], params["bias"], *self._op_args())
        except REFUSED:
            if isinstance(x, Tensor):
                raise
            # names the non-Tensor x
            return depthwise_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)

    def _op_args(self) -> tuple[list[int], list[int], list[int]]:
        """stride, (top, bottom, left, right) padding and dilation as the registered op takes them,
        kept while the attributes they come from stay the same (plain attributes a user may set)."""
        key = (self.kernel_size, self.stride, self.padding, self.dilation)
        cached = self.__dict__.get("_fastops_op_args")
        if cached is None or cached[0] != key:
            pads = resolve_padding(_OP, self.padding, self.kernel_size, self.stride, self.dilation)
            cached = (key, (list(self.stride), list(pads), list(self.dilation)))
            self.__dict__["_fastops_op_args"] = cached
        return cached[1]

    def _torch_forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.channels)

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
        # TunedModule's: DepthwiseConv2d.forward's C path would pass the constructor's padding (0).
        return policy.TunedModule.forward(self, x)

    def fastops_details(self) -> str:
        return super().fastops_details().replace(f"padding={self.padding!r}", "padding='tf_same'")

    def _fastops_forward(self, x: Tensor) -> Tensor:
        pads = tf_same_padding(x.shape[2:], self.kernel_size, self.stride, self.dilation)
        return _DEPTHWISE_OP(x, self.weight, self.bias, list(self.stride), list(pads), list(self.dilation))

    def _torch_forward(self, x: Tensor) -> Tensor:
        top, bottom, left, right = tf_same_padding(x.shape[2:], self.kernel_size, self.stride, self.dilation)
        padded = F.pad(x, (left, right, top, bottom))
        return F.conv2d(padded, self.weight, self.bias, self.stride, 0, self.dilation, self.channels)

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
