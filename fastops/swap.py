"""swap_modules: replace stock PyTorch modules of a live model with their fastops twins, in place.

What is swapped is decided by swap rules, which each ``fastops.nn`` module registers next to its own
class (a user can register rules for their own modules with :func:`register_swap_rule`). Built in:

* ``nn.GELU``                                   -> ``fastops.nn.GELU``
* depthwise ``nn.Conv2d`` (groups == in == out channels, zero padding) -> ``fastops.nn.DepthwiseConv2d``
* ``nn.Linear`` directly followed by ``nn.GELU`` inside an ``nn.Sequential``
                                                -> ``fastops.nn.LinearGELU`` at the Linear's index and
                                                   ``nn.Identity`` at the GELU's, so the indices, and
                                                   therefore the keys ``<seq>.<i>.weight``, stay put.

Each replacement reuses the original's Parameter objects, so ``state_dict`` keys, optimizer state
and checkpoints are unchanged and the outputs agree with the original's. The returned
:class:`SwapReport` lists every replacement (qualified name, old type, new type) and every module
that looked like a candidate but was left alone (with the reason), and can undo the swap:
``report.undo()`` puts the original module objects back, which still hold the same Parameters, so
training done between swap and undo is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

FilterFn = Callable[[nn.Module, str], bool]


@dataclass(frozen=True)
class SwapRule:
    """How one kind of torch module becomes its fastops twin.

    ``matches(m)``: m is a module this rule is about. ``skip_reason(m)``: None when the twin can take
    m over, else why not (the module is then listed in ``SwapReport.skipped``). ``replace(m)``: the
    twin, sharing m's Parameter objects. Rules are tried in registration order; the first that
    matches decides. Match exact types unless the rule knows a subclass's forward is unchanged: a
    swap must never silently drop behaviour.
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
    keys) stay put. ``filter_fn`` is asked about the first. Tried before the single-module rules."""

    name: str
    matches: Callable[[nn.Module, nn.Module], bool]
    replace: Callable[[Any, Any], nn.Module]


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
    """Every registered rule: the pair rules (tried first), then the single-module rules."""
    import fastops.nn  # noqa: F401  (each fastops.nn module registers its rules on import)

    return [*_PAIR_RULES, *_RULES]


@dataclass(frozen=True)
class Replacement:
    """One module replaced in ``parent`` under attribute/index ``attr``."""

    name: str  # qualified name in the model, as in model.named_modules()
    old_type: str
    new_type: str
    parent: nn.Module = field(repr=False, compare=False)
    attr: str = field(repr=False)
    old: nn.Module = field(repr=False, compare=False)
    new: nn.Module = field(repr=False, compare=False)


@dataclass(frozen=True)
class Skipped:
    name: str
    type: str
    reason: str


@dataclass
class SwapReport:
    """What :func:`swap_modules` did; ``undo()`` reverts it."""

    replaced: list[Replacement] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    undone: bool = False

    def __len__(self) -> int:
        return len(self.replaced)

    def counts(self) -> dict[str, int]:
        """``{"nn.GELU -> fastops.nn.GELU": n, ...}``."""
        out: dict[str, int] = {}
        for r in self.replaced:
            key = f"{r.old_type} -> {r.new_type}"
            out[key] = out.get(key, 0) + 1
        return out

    def undo(self) -> None:
        """Put every original module back (in reverse order), leaving the model as before the swap."""
        if self.undone:
            raise RuntimeError("fastops.swap_modules: this swap has already been undone")
        for r in reversed(self.replaced):
            setattr(r.parent, r.attr, r.old)
        self.undone = True

    def __str__(self) -> str:
        lines = [f"swap_modules: {len(self.replaced)} module(s) replaced"]
        lines += [f"  {r.name}: {r.old_type} -> {r.new_type}" for r in self.replaced]
        lines += [f"  skipped {s.name} ({s.type}): {s.reason}" for s in self.skipped]
        return "\n".join(lines)


def _type_name(m: nn.Module) -> str:
    t = type(m)
    module = t.__module__
    if module.startswith("torch.nn"):
        return f"nn.{t.__name__}"
    if module.startswith("fastops.nn"):
        return f"fastops.nn.{t.__name__}"
    return f"{module}.{t.__name__}"


def _qualify(prefix: str, attr: str) -> str:
    return f"{prefix}.{attr}" if prefix else attr


def swap_modules(model: nn.Module, *, filter_fn: FilterFn | None = None) -> SwapReport:
    """Swap, in place, the stock modules of ``model`` that fastops has fused twins for.

    Args:
        model: any nn.Module, on any device and dtype, in train or eval mode; it may already hold
            optimizer state (Parameters are reused, not copied).
        filter_fn: ``filter_fn(module, qualified_name) -> bool``; a candidate is swapped only when
            it returns True. For a Linear->GELU pair it is asked about the Linear. Default: all.

    Returns:
        A :class:`SwapReport` of the replacements (and of depthwise convs left alone, with why);
        ``report.undo()`` restores the original modules.

    Swap before wrapping the model in DDP / torch.compile and before building the optimizer is the
    simplest order, but because Parameters are reused an existing optimizer keeps working too.
    """
    rules = swap_rules()
    pair_rules = [r for r in rules if isinstance(r, PairRule)]
    single_rules = [r for r in rules if isinstance(r, SwapRule)]
    if not isinstance(model, nn.Module):
        raise TypeError(f"fastops.swap_modules: expected an nn.Module, got {type(model).__name__}")
    keep = filter_fn if filter_fn is not None else (lambda m, n: True)
    report = SwapReport()

    def replace(parent: nn.Module, attr: str, name: str, old: nn.Module, new: nn.Module) -> None:
        new.train(old.training)
        setattr(parent, attr, new)
        report.replaced.append(Replacement(name, _type_name(old), _type_name(new), parent, attr, old, new))

    def visit(parent: nn.Module, prefix: str) -> None:
        children = list(parent.named_children())
        fused: set[str] = set()  # attrs of the Sequential's children already replaced by a pair rule
        if isinstance(parent, nn.Sequential):
            for (attr, m), (next_attr, nxt) in zip(children, children[1:], strict=False):
                if attr in fused:
                    continue
                pair = next((r for r in pair_rules if r.matches(m, nxt)), None)
                if pair is not None and keep(m, _qualify(prefix, attr)):
                    replace(parent, attr, _qualify(prefix, attr), m, pair.replace(m, nxt))
                    replace(parent, next_attr, _qualify(prefix, next_attr), nxt, nn.Identity())
                    fused.update((attr, next_attr))
        for attr, m in children:
            name = _qualify(prefix, attr)
            if attr in fused:
                continue
            rule = next((r for r in single_rules if r.matches(m)), None)
            if rule is None:
                visit(m, name)
                continue
            reason = rule.skip_reason(m)
            if reason is not None:
                report.skipped.append(Skipped(name, _type_name(m), reason))
            elif keep(m, name):
                replace(parent, attr, name, m, rule.replace(m))

    visit(model, "")
    return report
