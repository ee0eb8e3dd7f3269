"""The registry of swap rules: how a kind of torch module becomes its fastops twin.

Each ``fastops.nn`` module registers its rules here, next to its own class, and a user can add rules
for their own modules with :func:`register_swap_rule`; :func:`fastops.swap_modules` applies them.
Both sides import this module, never each other. Also here: the checks every rule shares (a module
whose hooks or parametrizations would not follow it to a twin, global module hooks, a subclass
that overrides what the twin assumes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.modules import module as _module_globals
from torch.nn.utils import parametrize, prune
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm


@dataclass(frozen=True)
class SwapRule:
    """How one kind of torch module becomes its fastops twin.

    ``matches(m)``: m is a module this rule is about. ``skip_reason(m)``: None when the twin can take
    m over, else why not (the module is then listed in ``SwapReport.skipped``). ``replace(m)``: the
    twin, sharing m's Parameter objects; it must not modify m (the swap is planned before it is
    applied). Rules are tried in registration order; the first that matches decides. Match exact
    types unless the rule knows a subclass's forward is unchanged: a swap must never silently drop
    behaviour. Modules with hooks or parametrizations are skipped before ``skip_reason`` is asked.
    """

    name: str
    matches: Callable[[nn.Module], bool]
    # Any: each rule's functions take the module type its matches() has selected.
    replace: Callable[[Any], nn.Module]
    skip_reason: Callable[[Any], str | None] = lambda m: None


@dataclass(frozen=True)
class PairRule:
    """Two adjacent children of an ``nn.Sequential`` fused into one module: ``replace(first, second)``
    goes at the first's index and ``nn.Identity`` at the second's, so the indices (and state_dict
    keys) stay put. ``filter_fn`` is asked about the first, and a skipped pair is reported under the
    first's name. Tried before the single-module rules."""

    name: str
    matches: Callable[[nn.Module, nn.Module], bool]
    replace: Callable[[Any, Any], nn.Module]
    skip_reason: Callable[[Any, Any], str | None] = lambda first, second: None


_RULES: list[SwapRule] = []
_PAIR_RULES: list[PairRule] = []


def register_swap_rule(rule: SwapRule | PairRule) -> None:
    """Add a rule for :func:`swap_modules` (a rule of the same name is replaced, so re-registering
    on a module reload does not duplicate it)."""
    if not isinstance(rule, (SwapRule, PairRule)):
        raise TypeError(
            f"fastops.register_swap_rule: expected a SwapRule or PairRule, got {type(rule).__name__}"
        )
    rules: list[Any] = _PAIR_RULES if isinstance(rule, PairRule) else _RULES
    rules[:] = [r for r in rules if r.name != rule.name]
    rules.append(rule)


def swap_rules() -> list[SwapRule | PairRule]:
    """Every registered rule: the pair rules (tried first), then the single-module rules. The built-in
    ones are registered when ``fastops`` is imported (``fastops/__init__.py`` imports ``fastops.nn``)."""
    return [*_PAIR_RULES, *_RULES]


def class_path(cls: type) -> str:
    """``"package.module.Class"``: how rules name classes of packages fastops does not import."""
    return f"{cls.__module__}.{cls.__qualname__}"


def overrides(cls: type, base: type, *methods: str) -> list[str]:
    """The methods among ``methods`` that ``cls`` (a subclass of ``base``) defines differently."""
    return [name for name in methods if getattr(cls, name, None) is not getattr(base, name, None)]


_HOOK_DICTS = (
    ("forward hooks", "_forward_hooks"),
    ("forward pre-hooks", "_forward_pre_hooks"),
    ("backward hooks", "_backward_hooks"),
    ("backward pre-hooks", "_backward_pre_hooks"),
    ("state_dict hooks", "_state_dict_hooks"),
    ("state_dict pre-hooks", "_state_dict_pre_hooks"),
    ("load_state_dict pre-hooks", "_load_state_dict_pre_hooks"),
    ("load_state_dict post-hooks", "_load_state_dict_post_hooks"),
)


def unsafe_to_replace(m: nn.Module) -> str | None:
    """Why handing ``m``'s work to another module object would silently change behaviour (the
    hooks, parametrizations, pruning or weight norm attached to ``m`` would not follow), or None."""
    if parametrize.is_parametrized(m):
        names = ", ".join(getattr(m, "parametrizations", {}))
        return f"parametrized ({names}; torch.nn.utils.parametrize): the twin would not apply the parametrization"
    pre_hooks = list(m._forward_pre_hooks.values())
    if any(isinstance(h, prune.BasePruningMethod) for h in pre_hooks):
        return "pruned (torch.nn.utils.prune): the twin would drop weight_orig / weight_mask and the mask"
    if any(isinstance(h, WeightNorm) for h in pre_hooks):
        return "weight_norm: the twin would drop weight_g / weight_v and the recomputation of weight"
    if any(isinstance(h, SpectralNorm) for h in pre_hooks):
        return "spectral_norm: the twin would drop weight_orig and the normalisation of weight"
    found = [what for what, attr in _HOOK_DICTS if getattr(m, attr, None)]
    if found:
        return (
            f"has {', '.join(found)}: they belong to this module object and would not follow it to the twin"
        )
    return None


def global_module_hooks() -> bool:
    """Whether hooks registered for every module (``register_module_forward_hook`` and kin) exist."""
    return any(
        getattr(_module_globals, attr, None)
        for attr in (
            "_global_forward_hooks",
            "_global_forward_pre_hooks",
            "_global_backward_hooks",
            "_global_backward_pre_hooks",
        )
    )
