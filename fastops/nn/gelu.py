"""fastops.nn.GELU, BiasGELU, LinearGELU and GELUMlp: the module faces of fastops.gelu and
fastops.bias_gelu, and the swap rules for nn.GELU, GELU-by-contract modules (timm's), Linear -> GELU
in an nn.Sequential, and Mlp blocks (timm's Mlp)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fastops import policy
from fastops.nn._twin import REFUSED, accept_state_dict_keys, forward_mismatch, share_parameters
from fastops.ops._validate import check_approximate
from fastops.ops.gelu import bias_gelu, gelu
from fastops.policy import is_compiling, runs_torch
from fastops.swap_rules import (
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


# The registered ops, which the modules call directly: their C++ kernels check the tensors (a Tensor
# x always reaches them here), and the modules hold their own form checked.
_GELU_OP = torch.ops.fastops.gelu.default
_BIAS_GELU_OP = torch.ops.fastops.bias_gelu.default
_RUN_GELU = policy.compiled_runner("gelu")
_RUN_BIAS_GELU = policy.compiled_runner("bias_gelu")


class GELU(policy.TunedModule):
    """Drop-in for ``torch.nn.GELU``: ``y = gelu(x, approximate)``; see :func:`fastops.gelu`.
    ``backend``: see :mod:`fastops.policy` (under ``"auto"``, ``F.gelu`` runs where it is measured
    faster on this machine)."""

    policy_ops = ("gelu",)

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

    def fastops_details(self) -> str:
        return f"approximate={self.approximate!r}"

    def forward(self, x: Tensor) -> Tensor:
        if not is_compiling():
            y = _RUN_GELU(
                self, x, self.approximate
            )  # ours, when chosen for this x (measured faster, or forced by backend)
            if y is not None:
                return y
        # TunedModule.forward with its torch side inlined: the smallest op, where a call costs most.
        if runs_torch(self, x):
            return F.gelu(x, approximate=self.approximate)
        return self._fastops_forward(x)

    def _fastops_forward(self, x: Tensor) -> Tensor:
        # The registered op called directly (it checks x itself; the form was checked when the module
        # was built), the same path the tuner times and the forward runs.
        try:
            return _GELU_OP(x, self.approximate)
        except REFUSED:
            if isinstance(x, Tensor):
                raise
            return gelu(x, self.approximate)  # names the non-Tensor x

    def _torch_forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class BiasGELU(policy.TunedModule):
    """``y = gelu(x + bias)`` over the last dimension of x, with a learnable ``bias`` of ``features``
    elements (initialised to zero); see :func:`fastops.bias_gelu`. ``backend``: see
    :mod:`fastops.policy`."""

    policy_ops = ("bias_gelu",)

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

    def fastops_details(self) -> str:
        return f"approximate={self.approximate!r}"

    def forward(self, x: Tensor) -> Tensor:
        if not is_compiling():
            try:  # ours, when chosen for this x (measured faster, or forced by backend) (a bias of another dtype: None)
                y = _RUN_BIAS_GELU(self, x, self._parameters["bias"], self.approximate)
            except REFUSED:
                y = None  # the path below names what was wrong
            if y is not None:
                return y
        return super().forward(x)

    def _fastops_forward(self, x: Tensor) -> Tensor:
        bias = self._parameters["bias"]  # (self.bias: ~0.4 us through nn.Module.__getattr__)
        assert bias is not None
        return _BIAS_GELU_OP(x, bias if bias.dtype == x.dtype else bias.to(x.dtype), self.approximate)

    def _torch_forward(self, x: Tensor) -> Tensor:
        return F.gelu(x + self.bias.to(x.dtype), approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"features={self.features}, approximate={self.approximate!r}"


class LinearGELU(policy.TunedModule, nn.Linear):
    """``gelu(x @ weight.T + bias)``: a Linear without its bias add, followed by the fused bias+GELU.

    An ``nn.Linear`` subclass (its constructor's arguments, then ``approximate``), so ``weight``
    (out_features, in_features) and ``bias`` (out_features) are named, shaped and initialised as
    in ``torch.nn.Linear``, ``state_dict`` keys match a Linear's, and code that finds Linears by
    ``isinstance`` still finds it. A checkpoint of ``nn.Sequential(nn.Linear, nn.GELU)`` (keys
    ``0.weight`` / ``0.bias``) also loads directly. Under autocast the matmul runs in the autocast
    dtype and the bias is cast to it, as ``F.linear`` does; the fused kernel then runs in that dtype.
    """

    policy_ops = ("gelu", "bias_gelu")

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        approximate: str = "none",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        approximate = check_approximate("nn.LinearGELU", approximate)
        super().__init__(in_features, out_features, bias, device, dtype)
        self.approximate = approximate
        # nn.Sequential(nn.Linear, nn.GELU) checkpoints: "<prefix>0.weight" -> "<prefix>weight".
        accept_state_dict_keys(self, {"0.": ""})

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

    def fastops_op(self) -> str:
        return "gelu" if self.bias is None else "bias_gelu"

    def fastops_details(self) -> str:
        return f"linear {self.in_features} -> {self.out_features}, approximate={self.approximate!r}"

    def _fastops_forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight)
        if self.bias is None:
            return gelu(y, self.approximate)
        return _BIAS_GELU_OP(y, self.bias.to(y.dtype), self.approximate)

    def _torch_forward(self, x: Tensor) -> Tensor:
        return F.gelu(F.linear(x, self.weight, self.bias), approximate=self.approximate)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, approximate={self.approximate!r}"
        )


class PointwiseConvGELU(policy.TunedModule, nn.Conv2d):
    """``gelu(conv2d(x, weight) + bias)`` with a 1x1 kernel: a 1x1 ``nn.Conv2d`` (stride 1, no padding,
    groups 1) without its bias add, followed by the fused bias+GELU over the channels.

    An ``nn.Conv2d`` subclass: ``weight`` (out_channels, in_channels, 1, 1) and ``bias``
    (out_channels) are named, shaped and initialised as nn.Conv2d's. The bias+GELU runs on the
    output viewed channels-last, which is free for channels_last input (the conv then writes
    channels_last); NCHW input costs a copy.
    """

    policy_ops = ("gelu", "bias_gelu")

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        bias: bool = True,
        approximate: str = "none",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        approximate = check_approximate("nn.PointwiseConvGELU", approximate)
        super().__init__(in_channels, out_channels, 1, bias=bias, device=device, dtype=dtype)
        self.approximate = approximate

    @classmethod
    def from_torch(cls, conv: nn.Conv2d, gelu_module: nn.Module) -> PointwiseConvGELU:
        """A PointwiseConvGELU holding ``conv``'s own Parameter objects and ``gelu_module``'s form."""
        reason = _pointwise_conv_reason(conv)
        approximate = gelu_approximate(gelu_module)
        if reason is not None or approximate is None:
            raise TypeError(
                "fastops.nn.PointwiseConvGELU.from_torch: expected a 1x1 nn.Conv2d (stride 1, no padding, "
                f"groups 1) and a GELU, got {class_path(type(conv))} and {class_path(type(gelu_module))}"
            )
        bias = conv.bias is not None
        m = cls(conv.in_channels, conv.out_channels, bias, approximate, device="meta")
        share_parameters(m, conv)
        return m

    def fastops_op(self) -> str:
        return "gelu" if self.bias is None else "bias_gelu"

    def fastops_details(self) -> str:
        return f"1x1 conv {self.in_channels} -> {self.out_channels}, approximate={self.approximate!r}"

    def _torch_forward(self, x: Tensor) -> Tensor:
        return F.gelu(F.conv2d(x, self.weight, self.bias), approximate=self.approximate)

    def _fastops_forward(self, x: Tensor) -> Tensor:
        y = F.conv2d(x, self.weight)
        if self.bias is None:
            return gelu(y, self.approximate)
        # bias_gelu adds the bias along the last dimension: make it the channels (a view).
        y = bias_gelu(y.movedim(-3, -1), self.bias.to(y.dtype), self.approximate)
        return y.movedim(-1, -3)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size=(1, 1), "
            f"bias={self.bias is not None}, approximate={self.approximate!r}"
        )


def _pointwise_conv_reason(conv: nn.Module) -> str | None:
    """Why ``conv`` is not a plain 1x1 nn.Conv2d that PointwiseConvGELU computes, or None."""
    if not isinstance(conv, nn.Conv2d) or overrides(type(conv), nn.Conv2d, "forward", "_conv_forward"):
        return f"a {class_path(type(conv))}"
    plain = (
        conv.kernel_size == (1, 1)
        and conv.stride == (1, 1)
        and conv.dilation == (1, 1)
        and conv.groups == 1
        and conv.padding in ((0, 0), "valid")
    )
    return None if plain else "an nn.Conv2d other than 1x1, stride 1, no padding, groups 1"


class GELUMlp(nn.Module):
    """timm's ``Mlp`` (``fc1 -> act -> drop1 -> norm -> fc2 -> drop2``) with ``fc1`` and a GELU ``act``
    fused into one :class:`LinearGELU` (or :class:`PointwiseConvGELU` where fc1 is a 1x1 conv, timm's
    ``use_conv=True``, as in ConvNeXt-Atto); ``act`` is then ``nn.Identity``. The attribute names, and so the
    state_dict keys (``fc1.weight``, ``fc2.bias``, ...), are the Mlp's.

    Built by :meth:`from_torch` (and by :func:`fastops.swap_modules`), which keeps the Mlp's own
    ``drop1``, ``norm``, ``fc2`` and ``drop2`` module objects: whatever they do (dropout of any rate, in
    training too; a norm; their hooks) happens exactly as before, in the same order.
    """

    def __init__(
        self,
        fc1: LinearGELU | PointwiseConvGELU,
        drop1: nn.Module,
        norm: nn.Module,
        fc2: nn.Module,
        drop2: nn.Module,
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
    def from_torch(cls, mlp: nn.Module) -> GELUMlp:
        """From a module with children ``fc1`` (nn.Linear or 1x1 nn.Conv2d), ``act`` (a GELU), ``drop1``, ``norm``,
        ``fc2``, ``drop2`` whose forward runs them in that order, sharing its modules and Parameters."""
        reason = _mlp_skip_reason(mlp) if _is_gelu_mlp(mlp) else "expected an Mlp block with a GELU act"
        if reason is not None:
            raise ValueError(f"fastops.nn.GELUMlp.from_torch: {reason}")
        fc1: LinearGELU | PointwiseConvGELU
        if isinstance(mlp.fc1, nn.Linear):
            fc1 = LinearGELU.from_torch(mlp.fc1, mlp.get_submodule("act"))
        else:
            fc1 = PointwiseConvGELU.from_torch(mlp.fc1, mlp.get_submodule("act"))  # type: ignore[arg-type]
        return cls(fc1, *(getattr(mlp, name) for name in ("drop1", "norm", "fc2", "drop2")))


_MLP_CHILDREN = {"fc1", "act", "drop1", "norm", "fc2", "drop2"}


def _is_gelu_mlp(m: nn.Module) -> bool:
    """Structure, not class: the children of timm's Mlp, with a GELU act."""
    names = {name for name, _ in m.named_children()}
    return names == _MLP_CHILDREN and gelu_approximate(m.get_submodule("act")) is not None


def _mlp_skip_reason(mlp: nn.Module) -> str | None:
    fc1, act = mlp.get_submodule("fc1"), mlp.get_submodule("act")
    is_linear = isinstance(fc1, nn.Linear) and not overrides(type(fc1), nn.Linear, "forward")
    conv_reason = None if is_linear else _pointwise_conv_reason(fc1)
    if conv_reason is not None:
        return f"fc1 is {conv_reason}: only an nn.Linear or a plain 1x1 nn.Conv2d fuses with act"
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
    if approximate is None:  # matches() saw a GELU here: only a block changed since gets here
        return "act is not a GELU"

    def as_assumed(x: Tensor) -> Tensor:
        y = mlp.get_submodule("norm")(mlp.get_submodule("drop1")(F.gelu(fc1(x), approximate=approximate)))
        return mlp.get_submodule("drop2")(mlp.get_submodule("fc2")(y))

    modes = {sub: sub.training for sub in mlp.modules()}
    mlp.eval()  # dropout off and norms on their running statistics, for the probe only
    try:
        weight = fc1.get_parameter("weight")  # (out, in) or (out, in, 1, 1)
        probe = (2, weight.shape[1]) if is_linear else (2, weight.shape[1], 3, 3)
        reason = forward_mismatch(mlp, as_assumed, [probe], weight.device, weight.dtype)
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
        matches=lambda first, second: (
            isinstance(first, nn.Linear)
            and not isinstance(first, LinearGELU)  # ours is an nn.Linear too, its GELU already fused
            and gelu_approximate(second) is not None
        ),
        replace=LinearGELU.from_torch,
        skip_reason=lambda first, second: (
            f"subclass of nn.Linear overrides {', '.join(overrides(type(first), nn.Linear, 'forward'))}()"
            if overrides(type(first), nn.Linear, "forward")
            else _gelu_skip_reason(second)
        ),
    )
)
register_swap_rule(
    SwapRule("gelu_mlp", matches=_is_gelu_mlp, replace=GELUMlp.from_torch, skip_reason=_mlp_skip_reason)
)
