"""fastops.nn.SqueezeExcite: the module face of fastops.squeeze_excite, and the swap rule that
recognises its torch twins without importing timm or torchvision:

* the plain SE block (``SEBlock`` in docs/squeeze_excite.md): children ``fc1``, ``act``, ``fc2``,
  ``gate`` with ``nn.Linear`` FCs, ``forward(x) = x * gate(fc2(act(fc1(x.mean((2, 3))))))[:, :, None, None]``;
  recognised by those children and by behaviour (one tiny probe forward must agree);
* torchvision ``SqueezeExcitation`` (``avgpool``, ``fc1``/``fc2`` 1x1 convs, ``activation``,
  ``scale_activation``);
* timm ``SEModule`` (``fc1``, ``bn``, ``act``, ``fc2``, ``gate``; ``bn`` must be Identity and
  ``add_maxpool`` off) and timm's EfficientNet/MobileNetV3 ``SqueezeExcite`` (``conv_reduce``,
  ``act1``, ``conv_expand``, ``gate``).

The twin keeps the source's FC attribute names and Parameter objects, so state_dict keys are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fastops import policy
from fastops.nn._twin import share_parameters
from fastops.ops.squeeze_excite import check_act, check_gate, squeeze_excite
from fastops.swap_rules import SwapRule, register_swap_rule, unsafe_to_replace

_NAME = "nn.SqueezeExcite"


@dataclass(frozen=True)
class _Form:
    """Where a recognised SE block keeps its parts: the FC, activation and gate attribute names."""

    fc_names: tuple[str, str]
    act_attr: str
    gate_attr: str
    conv: bool


_TIMM_EFFICIENTNET = _Form(("conv_reduce", "conv_expand"), "act1", "gate", conv=True)
_TIMM_SE_MODULE = _Form(("fc1", "fc2"), "act", "gate", conv=True)
_TORCHVISION = _Form(("fc1", "fc2"), "activation", "scale_activation", conv=True)
_PLAIN = _Form(("fc1", "fc2"), "act", "gate", conv=False)
# (class module, class name) -> form; matched by name so neither library is imported.
_KNOWN_CLASSES = {
    ("timm.models._efficientnet_blocks", "SqueezeExcite"): _TIMM_EFFICIENTNET,
    ("timm.layers.squeeze_excite", "SEModule"): _TIMM_SE_MODULE,
    ("torchvision.ops.misc", "SqueezeExcitation"): _TORCHVISION,
}
_PLAIN_CHILDREN = {"fc1", "act", "fc2", "gate"}

# Activation and gate modules whose forward is, by contract, one of ours (exact classes; timm's
# own are named by module and class so timm is not imported).
_ACTS: dict[tuple[str, str], str] = {
    ("torch.nn.modules.activation", "ReLU"): "relu",
    ("torch.nn.modules.activation", "SiLU"): "silu",
    ("torch.nn.modules.activation", "GELU"): "gelu",  # approximate="none" only, checked below
    ("timm.layers.activations", "Swish"): "silu",
    ("timm.layers.activations", "GELU"): "gelu",
}
_GATES: dict[tuple[str, str], str] = {
    ("torch.nn.modules.activation", "Sigmoid"): "sigmoid",
    ("torch.nn.modules.activation", "Hardsigmoid"): "hardsigmoid",
    ("timm.layers.activations", "Sigmoid"): "sigmoid",
    ("timm.layers.activations", "HardSigmoid"): "hardsigmoid",
}


_TORCH_ACTS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "silu": F.silu, "gelu": F.gelu}
_TORCH_GATES: dict[str, Callable[[Tensor], Tensor]] = {"sigmoid": torch.sigmoid, "hardsigmoid": F.hardsigmoid}


def _class_key(m: nn.Module) -> tuple[str, str]:
    return type(m).__module__, type(m).__name__


class SqueezeExcite(policy.TunedModule):
    """Squeeze-excitation ``y = x * gate(fc2(act(fc1(mean_hw(x)))))`` on fastops kernels; see
    :func:`fastops.squeeze_excite`.

    ``fc1`` maps ``channels -> reduced_channels`` and ``fc2`` back, as ``nn.Linear`` (``conv=False``)
    or as 1x1 ``nn.Conv2d`` (``conv=True``, torchvision's and timm's form); they are child modules
    named ``fc_names`` (timm's EfficientNet block calls them ``conv_reduce`` / ``conv_expand``), so
    state_dict keys are those of the block it stands in for. Their weights may be any floating
    dtype: the FCs run in float32 inside the op (float64 for float64 x).

    ``backend`` (``"auto"``, ``"fastops"`` or ``"torch"``) picks the kernels as :mod:`fastops.policy`
    says: under ``"auto"``, the eager block (mean, the FC modules, ``x * scale``) runs for the inputs
    where it is measured faster than ours on this machine.
    """

    policy_ops = ("squeeze_excite",)

    def __init__(
        self,
        channels: int,
        reduced_channels: int,
        act: str = "relu",
        gate: str = "sigmoid",
        bias: bool = True,
        conv: bool = False,
        fc_names: tuple[str, str] = ("fc1", "fc2"),
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for arg, value in (("channels", channels), ("reduced_channels", reduced_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"fastops.{_NAME}: expected {arg} to be an int >= 1, got {value!r}")
        self.channels, self.reduced_channels = channels, reduced_channels
        self.act = check_act(_NAME, act)
        self.gate = check_gate(_NAME, gate)
        self.conv = conv
        self.fc_names = (str(fc_names[0]), str(fc_names[1]))
        factory: dict[str, Any] = {"device": device, "dtype": dtype, "bias": bias}
        if conv:
            fc1: nn.Module = nn.Conv2d(channels, reduced_channels, 1, **factory)
            fc2: nn.Module = nn.Conv2d(reduced_channels, channels, 1, **factory)
        else:
            fc1, fc2 = (
                nn.Linear(channels, reduced_channels, **factory),
                nn.Linear(reduced_channels, channels, **factory),
            )
        self.add_module(self.fc_names[0], fc1)
        self.add_module(self.fc_names[1], fc2)

    def fastops_details(self) -> str:
        fc1: Any = self._modules[self.fc_names[0]]
        weight_dtype = str(fc1.weight.dtype).removeprefix("torch.")
        return f"act={self.act!r}, gate={self.gate!r}, {weight_dtype} FC weights"

    def _torch_forward(self, x: Tensor) -> Tensor:
        # The stock block, op for op (under autocast too): what this module stands in for.
        fc1: Any = self._modules[self.fc_names[0]]
        fc2: Any = self._modules[self.fc_names[1]]
        pooled = x.mean((2, 3), keepdim=self.conv)
        scale = _TORCH_GATES[self.gate](fc2(_TORCH_ACTS[self.act](fc1(pooled))))
        return x * (scale if self.conv else scale[:, :, None, None])

    def _fastops_forward(self, x: Tensor) -> Tensor:
        fc1: Any = self._modules[self.fc_names[0]]  # nn.Linear or 1x1 nn.Conv2d
        fc2: Any = self._modules[self.fc_names[1]]
        w1, w2 = fc1.weight, fc2.weight
        if self.conv:
            # A 1x1 conv's (out, in, 1, 1) weight as a Linear's (out, in), a view.
            w1, w2 = w1.flatten(1), w2.flatten(1)
        return squeeze_excite(x, w1, fc1.bias, w2, fc2.bias, self.act, self.gate)

    def extra_repr(self) -> str:
        return (
            f"channels={self.channels}, reduced_channels={self.reduced_channels}, act={self.act!r}, "
            f"gate={self.gate!r}, conv={self.conv}"
        )

    @classmethod
    def from_torch(cls, m: nn.Module) -> SqueezeExcite:
        """The same block on fastops kernels, sharing ``m``'s FC Parameter objects under the same
        attribute names. ``m``: a plain SE block, torchvision ``SqueezeExcitation``, or timm
        ``SEModule`` / ``SqueezeExcite`` (see the module docstring)."""
        form = _form_of(m)
        if form is None:
            raise TypeError(
                f"fastops.{_NAME}.from_torch: expected an SE block (plain fc1/act/fc2/gate, torchvision "
                f"SqueezeExcitation, timm SEModule or SqueezeExcite), got {type(m).__name__}"
            )
        reason = _skip_reason(m)
        if reason is not None:
            raise ValueError(f"fastops.{_NAME}.from_torch: {reason}")
        fc1, fc2 = (getattr(m, name) for name in form.fc_names)
        act = _ACTS[_class_key(getattr(m, form.act_attr))]
        gate = _GATES[_class_key(getattr(m, form.gate_attr))]
        channels = fc1.in_channels if form.conv else fc1.in_features
        reduced = fc1.out_channels if form.conv else fc1.out_features
        twin = cls(channels, reduced, act, gate, conv=form.conv, fc_names=form.fc_names, device="meta")
        for name in form.fc_names:
            share_parameters(getattr(twin, name), getattr(m, name))
        return twin


# ---- recognising the torch twins ------------------------------------------------------------------


def _form_of(m: nn.Module) -> _Form | None:
    known = _KNOWN_CLASSES.get(_class_key(m))
    if known is not None:
        return known
    if {name for name, _ in m.named_children()} == _PLAIN_CHILDREN and all(
        type(getattr(m, name)) is nn.Linear for name in _PLAIN.fc_names
    ):
        return _PLAIN
    return None


def _has_hooks(m: nn.Module) -> bool:
    return bool(
        m._forward_hooks
        or m._forward_pre_hooks
        or m._backward_hooks
        or getattr(m, "_backward_pre_hooks", None)
    )


def _fc_skip_reason(name: str, fc: nn.Module, conv: bool) -> str | None:
    want = nn.Conv2d if conv else nn.Linear
    if type(fc) is not want:
        return f"{name} is a {type(fc).__name__}, expected exactly nn.{want.__name__}"
    if _has_hooks(fc):
        return f"{name} has forward/backward hooks, which the fused op would not call"
    # The swap's own check: parametrizations, and the state_dict hooks _has_hooks does not look at.
    reason = unsafe_to_replace(fc)
    if reason is not None:
        return f"{name}: {reason}"
    if conv:
        assert isinstance(fc, nn.Conv2d)
        plain = (
            fc.kernel_size == (1, 1)
            and fc.stride == (1, 1)
            and fc.dilation == (1, 1)
            and fc.groups == 1
            and fc.padding in ((0, 0), "valid")
        )
        if not plain:
            return f"{name} is not a plain 1x1 conv (kernel 1, stride 1, no padding, groups 1)"
    return None


def _act_skip_reason(what: str, module: nn.Module, table: dict[tuple[str, str], str]) -> str | None:
    if _class_key(module) not in table:
        known = sorted({f"{k[1]}" for k in table})
        return f"{what} {type(module).__name__} is not one of the fused ones ({', '.join(known)})"
    if isinstance(module, nn.GELU) and module.approximate != "none":
        return f"{what} GELU(approximate={module.approximate!r}) is not fused (only the erf form)"
    if _has_hooks(module):
        return f"{what} module has hooks, which the fused op would not call"
    reason = unsafe_to_replace(module)
    return None if reason is None else f"{what} module: {reason}"


def _skip_reason(m: nn.Module) -> str | None:
    form = _form_of(m)
    if form is None:
        return "not a recognised SE block"
    # Any: the FCs are nn.Linear or nn.Conv2d once the checks below pass.
    fc1: Any = getattr(m, form.fc_names[0], None)
    fc2: Any = getattr(m, form.fc_names[1], None)
    for name, fc in zip(form.fc_names, (fc1, fc2), strict=True):
        if not isinstance(fc, nn.Module):
            return f"{name} is missing"
        reason = _fc_skip_reason(name, fc, form.conv)
        if reason is not None:
            return reason
    reason = _act_skip_reason("activation", getattr(m, form.act_attr), _ACTS) or _act_skip_reason(
        "gate", getattr(m, form.gate_attr), _GATES
    )
    if reason is not None:
        return reason
    c_in, r_out = fc1.weight.shape[1], fc1.weight.shape[0]
    if tuple(fc2.weight.shape[:2]) != (c_in, r_out):
        return f"fc shapes {list(fc1.weight.shape)} and {list(fc2.weight.shape)} do not form C -> R -> C"
    if form is _TIMM_SE_MODULE:
        if getattr(m, "add_maxpool", False):
            return "add_maxpool=True (mean + max pooling) is not fused"
        if type(getattr(m, "bn", None)) is not nn.Identity:
            return f"a {type(m.bn).__name__} between fc1 and act is not fused"
    if form is _TORCHVISION:
        pool = getattr(m, "avgpool", None)
        if type(pool) is not nn.AdaptiveAvgPool2d or pool.output_size not in (1, (1, 1)):
            return "avgpool is not AdaptiveAvgPool2d(1)"
    if form is _PLAIN:
        return _probe_plain(m, fc1, fc2)
    return None


def _probe_plain(m: Any, fc1: Any, fc2: Any) -> str | None:
    """A module with the plain block's children is swapped only if its forward is the SE formula:
    one tiny forward (2 x C x 2 x 3) is compared with :func:`fastops.reference.squeeze_excite`."""
    from fastops.reference.squeeze_excite import squeeze_excite as reference

    weight = fc1.weight
    if weight.is_meta:
        return "on the meta device, its forward cannot be checked against the SE formula"
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, weight.shape[1], 2, 3, generator=gen).to(weight.device, weight.dtype)
    act, gate = _ACTS[_class_key(m.act)], _GATES[_class_key(m.gate)]
    try:
        with torch.no_grad():
            got = m(x)
            want = reference(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, act, gate)
    except Exception as exc:  # noqa: BLE001  (any failure means: not the formula we fuse)
        return f"its forward failed on a probe input ({type(exc).__name__}), so it is not checked as SE"
    tol = 1e-4 if weight.dtype in (torch.float32, torch.float64) else 3e-2
    if not (
        isinstance(got, Tensor) and got.shape == want.shape and torch.allclose(got, want, rtol=tol, atol=tol)
    ):
        return "its forward is not x * gate(fc2(act(fc1(x.mean((2, 3))))))[:, :, None, None]"
    return None


register_swap_rule(
    SwapRule(
        "squeeze_excite",
        matches=lambda m: _form_of(m) is not None,
        replace=SqueezeExcite.from_torch,
        skip_reason=_skip_reason,
    )
)
