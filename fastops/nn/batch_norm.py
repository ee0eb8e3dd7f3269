"""fastops.nn.BatchNorm2d and BatchNormAct2d: the module faces of fastops.batch_norm, and the swap
rules for ``nn.BatchNorm2d`` and for timm's ``BatchNormAct2d`` (batch norm, then its own ``drop`` and
``act`` modules)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fastops import policy
from fastops.nn._twin import forward_mismatch, share_parameters
from fastops.ops.batch_norm import batch_norm
from fastops.swap_rules import (
    SwapRule,
    class_path,
    global_module_hooks,
    overrides,
    register_swap_rule,
    unsafe_to_replace,
)

_STATE = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


class BatchNorm2d(policy.TunedModule, nn.BatchNorm2d):
    """Drop-in for ``torch.nn.BatchNorm2d`` on fastops kernels: a subclass with the same
    constructor, parameters, buffers, state_dict, running-statistics bookkeeping (``momentum``,
    ``momentum=None`` for a cumulative average, ``track_running_stats``, ``num_batches_tracked``)
    and train/eval behaviour; only the kernels differ (see :func:`fastops.batch_norm`). Being an
    ``nn.BatchNorm2d``, it is converted by ``nn.SyncBatchNorm.convert_sync_batchnorm`` like one.
    ``backend``: see :mod:`fastops.policy`."""

    policy_ops = ("batch_norm",)

    @classmethod
    def from_torch(cls, m: nn.BatchNorm2d) -> BatchNorm2d:
        """A fastops BatchNorm2d holding ``m``'s own Parameter and buffer objects (no copy), so the
        running statistics and ``num_batches_tracked`` advance in both."""
        if not isinstance(m, nn.BatchNorm2d):
            raise TypeError(
                f"fastops.nn.BatchNorm2d.from_torch: expected a torch.nn.BatchNorm2d, got {class_path(type(m))}"
            )
        new = cls(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats, device="meta")
        share_parameters(new, m, _STATE)
        new.train(m.training)
        return new

    def fastops_details(self) -> str:
        return f"affine={self.affine}, track_running_stats={self.track_running_stats}, {'train' if self.training else 'eval'} mode"

    def train(self, mode: bool = True) -> BatchNorm2d:
        if mode != self.training:  # train and eval mode compute differently: choose again
            self.__dict__.pop(policy.STATE_ATTR, None)
        return super().train(mode)

    def forward(self, x: Tensor) -> Tensor:
        self._check_input_dim(x)
        return super().forward(x)  # TunedModule's: ours or nn.BatchNorm2d's

    def _torch_forward(self, x: Tensor) -> Tensor:
        return nn.BatchNorm2d.forward(self, x)

    def _fastops_forward(self, x: Tensor) -> Tensor:
        # nn.BatchNorm2d's own bookkeeping, step for step.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        keep_stats = not self.training or self.track_running_stats
        return batch_norm(
            x,
            self.running_mean if keep_stats else None,
            self.running_var if keep_stats else None,
            self.weight,
            self.bias,
            batch_stats,
            factor,
            self.eps,
        )


# nn.BatchNorm2d subclasses whose forward is nn.BatchNorm2d's followed by their own ``drop`` and then
# ``act`` children (timm's BatchNormAct2d, in EfficientNet, MobileNetV3, ...). Class paths, so timm
# need not be imported; the swap still checks the claim on a probe input.
_NORM_ACT_CLASSES = {"timm.layers.norm_act.BatchNormAct2d"}


class BatchNormAct2d(BatchNorm2d):
    """``act(drop(batch_norm(x)))``: the twin of timm's ``BatchNormAct2d``, built by :meth:`from_torch`
    around the original's own ``drop`` and ``act`` module objects, so the state_dict keys and whatever
    those modules do are unchanged; the batch norm is :class:`BatchNorm2d`'s."""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        act: nn.Module | None = None,
        drop: nn.Module | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.drop = drop if drop is not None else nn.Identity()
        self.act = act if act is not None else nn.Identity()

    @classmethod
    def from_torch(cls, m: nn.BatchNorm2d) -> BatchNormAct2d:  # type: ignore[override]
        if class_path(type(m)) not in _NORM_ACT_CLASSES:
            raise TypeError(
                f"fastops.nn.BatchNormAct2d.from_torch: expected timm's BatchNormAct2d, got {class_path(type(m))}"
            )
        new = super().from_torch(m)  # the batch norm's Parameters and buffers, train/eval
        new.drop = m.get_submodule("drop")
        new.act = m.get_submodule("act")
        return new  # type: ignore[return-value]

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.drop(super().forward(x)))


def _norm_act_skip_reason(m: nn.BatchNorm2d) -> str | None:
    """Why a module registered as BatchNormAct2d is not one the twin computes, or None."""
    names = {name for name, _ in m.named_children()}
    if names != {"drop", "act"}:
        return f"children {sorted(names)}, not drop and act"
    # The probe runs the module's forward: it must not fire hooks or move the running statistics.
    hooked = [name for name, sub in m.named_modules() if name and unsafe_to_replace(sub)]
    if hooked or global_module_hooks():
        where = ", ".join(hooked) if hooked else "global module hooks"
        return f"its forward cannot be checked without running the hooks of {where}"
    if m.running_mean is None or m.running_var is None:
        return "it tracks no running statistics, which the eval-mode probe needs"

    def as_assumed(x: Tensor) -> Tensor:
        y = nn.functional.batch_norm(x, m.running_mean, m.running_var, m.weight, m.bias, False, 0.0, m.eps)
        return m.get_submodule("act")(m.get_submodule("drop")(y))

    modes = {sub: sub.training for sub in m.modules()}
    m.eval()
    try:
        ref = m.running_mean
        reason = forward_mismatch(m, as_assumed, [(2, m.num_features, 3, 3)], ref.device, ref.dtype)
    finally:
        for sub, training in modes.items():
            sub.training = training
    return None if reason is None else f"registered as batch norm -> drop -> act, but {reason}"


# What every class body defines: not behaviour a twin could lose.
_CLASS_METADATA = {
    "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__annotations__",
    "__firstlineno__", "__static_attributes__", "__orig_bases__", "__parameters__", "__init__",
}  # fmt: skip


def _subclass_members(cls: type, base: type) -> list[str]:
    """What the classes between ``cls`` and ``base`` define (methods, properties, class attributes),
    besides their constructors: behaviour that a twin of ``base``'s would not have."""
    names: dict[str, None] = {}
    for klass in cls.__mro__[: cls.__mro__.index(base)]:
        names.update(dict.fromkeys(n for n in vars(klass) if n not in _CLASS_METADATA))
    return list(names)


def _skip_reason(m: nn.BatchNorm2d) -> str | None:
    # torch refuses eps <= 0 only when training; fastops.batch_norm always (it needs a finite
    # float32 eps > 0), so a module with another eps keeps torch's kernel for its eval mode.
    tiny = torch.finfo(torch.float32)
    if not tiny.smallest_normal * tiny.eps <= m.eps <= tiny.max:
        return f"eps={m.eps!r}: fastops.batch_norm needs a float32 eps > 0 (torch takes it in eval mode)"
    changed = overrides(type(m), nn.BatchNorm2d, "forward")
    if changed:
        return f"subclass of nn.BatchNorm2d overrides {', '.join(changed)}()"
    # Its own methods (a freeze(), a _check_input_dim that takes 3-D input) would be gone.
    members = _subclass_members(type(m), nn.BatchNorm2d)
    if members:
        return f"subclass of nn.BatchNorm2d defines {', '.join(members)}, which the twin would not have"
    return None


# Before the BatchNorm2d rule: these are nn.BatchNorm2d subclasses too, which it would skip.
register_swap_rule(
    SwapRule(
        "batch_norm_act",
        matches=lambda m: class_path(type(m)) in _NORM_ACT_CLASSES,
        replace=BatchNormAct2d.from_torch,
        skip_reason=_norm_act_skip_reason,
    )
)
register_swap_rule(
    SwapRule(
        "batch_norm",
        matches=lambda m: isinstance(m, nn.BatchNorm2d) and not isinstance(m, BatchNorm2d),
        replace=BatchNorm2d.from_torch,
        skip_reason=_skip_reason,
    )
)
