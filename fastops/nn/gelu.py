"""fastops.nn.GELU, BiasGELU, LinearGELU and LinearGELUMlp: the module faces of fastops.gelu and
fastops.bias_gelu, and the swap rules for nn.GELU, GELU-by-contract modules (timm's), Linear -> GELU
in an nn.Sequential, and Mlp blocks (timm's Mlp)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fastops.nn._twin import accept_state_dict_keys, forward_mismatch, share_parameters
from fastops.ops._validate import check_approximate
from fastops.ops.gelu import bias_gelu, gelu
from fastops.swap import (
    PairRule,
    SwapRule,
    class_path,
    global_module_hooks,
    overrides,
    register_swap_rule,
    unsafe_to_replace,
)

# Modules that are GELU by contract: class path -> approximate. Paths, not classes, so that timm
# need not be imported (or installed) for its modules to be recognised.
_GELU_MODULES: dict[str, str] = {
    "timm.layers.activations.GELU": "none",
    "timm.layers.activations.GELUTanh": "tanh",
}


def register_gelu_module(cls: type[nn.Module] | str, approximate: str = "none") -> None:
    """Declare that modules of exactly this class compute ``F.gelu(x, approximate=approximate)`` and
    hold no state, so :func:`fastops.swap_modules` replaces them with :class:`GELU` (and fuses them
    after an ``nn.Linear``). ``cls`` is the class or its path ``"package.module.Class"`` (then its
    package need not be imported). The swap still checks the claim on a probe input and skips, with
    the reason, a module that does not keep it. Built in: timm's ``GELU`` and ``GELUTanh``."""
    path = cls if isinstance(cls, str) else class_path(cls) if isinstance(cls, type) else None
    if not isinstance(path, str) or "." not in path:
        raise TypeError(
            f"fastops.nn.register_gelu_module: expected cls to be a class or a 'package.module.Class' "
            f"path, got {cls!r}"
        )
    _GELU_MODULES[path] = check_approximate("nn.register_gelu_module", approximate)


def gelu_approximate(m: nn.Module) -> str | None:
    """The ``approximate`` of a module that is a GELU (an ``nn.GELU``, a :class:`GELU` or a
    registered GELU-by-contract module), else None."""
    if isinstance(m, (nn.GELU, GELU)):
        return m.approximate
    return _GELU_MODULES.get(class_path(type(m)))


def _gelu_skip_reason(m: nn.Module) -> str | None:
    """Why a module that looks like a GELU is not one the fastops GELU can stand in for."""
    if isinstance(m, nn.GELU):
        changed = overrides(type(m), nn.GELU, "forward")
        return f"subclass of nn.GELU overrides {', '.join(changed)}()" if changed else None
    if isinstance(m, GELU):
        return None
    approximate = _GELU_MODULES[class_path(type(m))]
    if any(True for _ in m.parameters()) or any(True for _ in m.buffers()) or any(True for _ in m.children()):
        return "registered as a GELU module but holds parameters, buffers or submodules"
    reason = forward_mismatch(
        m,
        lambda x: F.gelu(x, approximate=approximate),
        [(64,)],
        torch.device("cpu"),
        torch.float64,
    )
    return None if reason is None else f"registered as GELU(approximate={approximate!r}), but {reason}"


class GELU(nn.Module):
    """Drop-in for ``torch.nn.GELU``: ``y = gelu(x, approximate)``; see :func:`fastops.gelu`."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = check_approximate("nn.GELU", approximate)

    @classmethod
    def from_torch(cls, m: nn.Module) -> GELU:
        """A fastops GELU with the same ``approximate`` as ``m``, an ``nn.GELU`` or a module registered
        with :func:`register_gelu_module`."""
        approximate = gelu_approximate(m)
        if approximate is None:
            raise TypeError(
                "fastops.nn.GELU.from_torch: expected a torch.nn.GELU or a module registered with "
                f"fastops.nn.register_gelu_module, got {class_path(type(m))}"
            )
        return cls(approximate)

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class BiasGELU(nn.Module):
    """``y = gelu(x + bias)`` over the last dimension of x, with a learnable ``bias`` of ``features``
    elements (initialised to zero); see :func:`fastops.bias_gelu`."""

    def __init__(
        self,
        features: int,
        approximate: str = "none",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ValueError(f"fastops.nn.BiasGELU: expected features to be an int >= 1, got {features!r}")
        self.features = features
        self.approximate = check_approximate("nn.BiasGELU", approximate)
        self.bias = nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return bias_gelu(x, self.bias.to(x.dtype), self.approximate)

    def extra_repr(self) -> str:
        return f"features={self.features}, approximate={self.approximate!r}"


class LinearGELU(nn.Module):
    """``gelu(x @ weight.T + bias)``: a Linear without its bias add, followed by the fused bias+GELU.

    ``weight`` (out_features, in_features) and ``bias`` (out_features) are named, shaped and
    initialised as in ``torch.nn.Linear``, so ``state_dict`` keys match a Linear's. A checkpoint of
    ``nn.Sequential(nn.Linear, nn.GELU)`` (keys ``0.weight`` / ``0.bias``) also loads directly.
    Under autocast the matmul runs in the autocast dtype and the bias is cast to it, as
    ``F.linear`` does; the fused kernel then runs in that dtype.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        approximate: str = "none",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.approximate = check_approximate("nn.LinearGELU", approximate)
        factory: dict[str, Any] = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        if bias:
            self.bias: nn.Parameter | None = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        # nn.Sequential(nn.Linear, nn.GELU) checkpoints: "<prefix>0.weight" -> "<prefix>weight".
        accept_state_dict_keys(self, {"0.": ""})

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1]
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_torch(cls, linear: nn.Linear, gelu_module: nn.Module) -> LinearGELU:
        """A LinearGELU holding ``linear``'s own Parameter objects (no copy) and ``gelu_module``'s form
        (an ``nn.GELU`` or a module registered with :func:`register_gelu_module`)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(
                f"fastops.nn.LinearGELU.from_torch: expected a torch.nn.Linear, got {type(linear).__name__}"
            )
        approximate = gelu_approximate(gelu_module)
        if approximate is None:
            raise TypeError(
                f"fastops.nn.LinearGELU.from_torch: expected a torch.nn.GELU, got {type(gelu_module).__name__}"
            )
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, approximate, device="meta")
        share_parameters(m, linear)
        return m

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight)
        if self.bias is None:
            return gelu(y, self.approximate)
        return bias_gelu(y, self.bias.to(y.dtype), self.approximate)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, approximate={self.approximate!r}"
        )


class LinearGELUMlp(nn.Module):
    """timm's ``Mlp`` (``fc1 -> act -> drop1 -> norm -> fc2 -> drop2``) with ``fc1`` and a GELU ``act``
    fused into one :class:`LinearGELU`; ``act`` is then ``nn.Identity``. The attribute names, and so the
    state_dict keys (``fc1.weight``, ``fc2.bias``, ...), are the Mlp's.

    Built by :meth:`from_torch` (and by :func:`fastops.swap_modules`), which keeps the Mlp's own
    ``drop1``, ``norm``, ``fc2`` and ``drop2`` module objects: whatever they do (dropout of any rate, in
    training too; a norm; their hooks) happens exactly as before, in the same order.
    """

    def __init__(
        self, fc1: LinearGELU, drop1: nn.Module, norm: nn.Module, fc2: nn.Module, drop2: nn.Module
    ) -> None:
        super().__init__()
        self.fc1 = fc1
        self.act = nn.Identity()  # the GELU runs inside fc1
        self.drop1 = drop1
        self.norm = norm
        self.fc2 = fc2
        self.drop2 = drop2

    def forward(self, x: Tensor) -> Tensor:
        return self.drop2(self.fc2(self.norm(self.drop1(self.fc1(x)))))

    @classmethod
    def from_torch(cls, mlp: nn.Module) -> LinearGELUMlp:
        """From a module with children ``fc1`` (nn.Linear), ``act`` (a GELU), ``drop1``, ``norm``,
        ``fc2``, ``drop2`` whose forward runs them in that order, sharing its modules and Parameters."""
        reason = _mlp_skip_reason(mlp) if _is_gelu_mlp(mlp) else "expected an Mlp block with a GELU act"
        if reason is not None:
            raise ValueError(f"fastops.nn.LinearGELUMlp.from_torch: {reason}")
        fc1 = LinearGELU.from_torch(mlp.fc1, mlp.act)  # type: ignore[arg-type]
        return cls(fc1, *(getattr(mlp, name) for name in ("drop1", "norm", "fc2", "drop2")))


_MLP_CHILDREN = {"fc1", "act", "drop1", "norm", "fc2", "drop2"}


def _is_gelu_mlp(m: nn.Module) -> bool:
    """Structure, not class: the children of timm's Mlp, with a GELU act."""
    names = {name for name, _ in m.named_children()}
    return names == _MLP_CHILDREN and gelu_approximate(m.get_submodule("act")) is not None


def _mlp_skip_reason(mlp: nn.Module) -> str | None:
    fc1, act = mlp.get_submodule("fc1"), mlp.get_submodule("act")
    if not isinstance(fc1, nn.Linear) or overrides(type(fc1), nn.Linear, "forward"):
        return f"fc1 is a {class_path(type(fc1))}, not an nn.Linear (fc1 + act are fused as a Linear)"
    if any(True for _ in mlp.parameters(recurse=False)) or any(True for _ in mlp.buffers(recurse=False)):
        return "holds parameters or buffers of its own, which the fused block would not use"
    for name, child in (("fc1", fc1), ("act", act)):
        reason = unsafe_to_replace(child) or (_gelu_skip_reason(child) if name == "act" else None)
        if reason is not None:
            return f"{name}: {reason}"
    # The probe below runs the block's forward: it must not fire anybody's hooks or move a norm's
    # running statistics.
    hooked = [name for name, sub in mlp.named_modules() if name and unsafe_to_replace(sub)]
    if hooked or global_module_hooks():
        where = ", ".join(hooked) if hooked else "global module hooks"
        return f"its forward cannot be checked without running the hooks or parametrizations of {where}"
    approximate = gelu_approximate(act)

    def as_assumed(x: Tensor) -> Tensor:
        y = mlp.get_submodule("norm")(mlp.get_submodule("drop1")(F.gelu(fc1(x), approximate=approximate)))
        return mlp.get_submodule("drop2")(mlp.get_submodule("fc2")(y))

    modes = {sub: sub.training for sub in mlp.modules()}
    mlp.eval()  # dropout off and norms on their running statistics, for the probe only
    try:
        reason = forward_mismatch(
            mlp, as_assumed, [(2, fc1.in_features)], fc1.weight.device, fc1.weight.dtype
        )
    finally:
        for sub, training in modes.items():
            sub.training = training
    return None if reason is None else f"{reason} (fc1 -> act -> drop1 -> norm -> fc2 -> drop2)"


register_swap_rule(
    SwapRule(
        "gelu",
        matches=lambda m: gelu_approximate(m) is not None and not isinstance(m, GELU),
        replace=GELU.from_torch,
        skip_reason=_gelu_skip_reason,
    )
)
register_swap_rule(
    PairRule(
        "linear_gelu",
        matches=lambda first, second: isinstance(first, nn.Linear) and gelu_approximate(second) is not None,
        replace=LinearGELU.from_torch,
        skip_reason=lambda first, second: (
            f"subclass of nn.Linear overrides {', '.join(overrides(type(first), nn.Linear, 'forward'))}()"
            if overrides(type(first), nn.Linear, "forward")
            else _gelu_skip_reason(second)
        ),
    )
)
register_swap_rule(
    SwapRule("gelu_mlp", matches=_is_gelu_mlp, replace=LinearGELUMlp.from_torch, skip_reason=_mlp_skip_reason)
)
