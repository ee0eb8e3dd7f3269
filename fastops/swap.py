"""swap_modules: replace stock PyTorch modules of a live model with their fastops twins, in place.

What is swapped is decided by swap rules, which each ``fastops.nn`` module registers next to its own
class (a user can register rules for their own modules with :func:`register_swap_rule`). Built in:

* ``nn.GELU``, and modules that are GELU by contract (timm's ``GELU`` and ``GELUTanh``; add your
  own with :func:`fastops.nn.register_gelu_module`)            -> ``fastops.nn.GELU``
* ``nn.BatchNorm2d`` (and subclasses that define nothing but a constructor)
                                                -> ``fastops.nn.BatchNorm2d``, a subclass of it
                                                   sharing the Parameters and running statistics
* timm's ``BatchNormAct2d`` (batch norm, then its ``drop`` and ``act`` children)
                                                -> ``fastops.nn.BatchNormAct2d``, around the same
                                                   ``drop`` and ``act`` module objects
* depthwise ``nn.Conv2d`` (groups == in == out channels, zero padding mode)
                                                -> ``fastops.nn.DepthwiseConv2d``
* depthwise convs with TensorFlow "same" padding computed per input size (timm's ``Conv2dSame``;
  add your own with :func:`fastops.nn.register_same_padding_conv2d`)
                                                -> ``fastops.nn.DepthwiseConv2dSame``
* ``nn.Linear`` directly followed by a GELU inside an ``nn.Sequential`` (whose class does not
  override ``forward``, and whose owner's forward only calls it: a forward that iterates or
  indexes it, or an overridden one, may use the Linear's output apart from the GELU)
                                                -> ``fastops.nn.LinearGELU`` at the Linear's index and
                                                   ``nn.Identity`` at the GELU's, so the indices, and
                                                   therefore the keys ``<seq>.<i>.weight``, stay put.
* Mlp blocks (children ``fc1, act, drop1, norm, fc2, drop2`` with ``fc1`` an ``nn.Linear`` or a 1x1
  ``nn.Conv2d`` and ``act`` a GELU: timm's ``Mlp`` in ViTs and ConvNeXts) -> ``fastops.nn.GELUMlp``,
  same attribute names and state_dict keys, ``fc1`` + ``act`` fused into a ``LinearGELU`` (or a
  ``PointwiseConvGELU``); its dropouts, norm and ``fc2`` are kept as they are.
* squeeze-excitation blocks: a plain SE block (children ``fc1, act, fc2, gate``, Linear FCs),
  torchvision's ``SqueezeExcitation`` and timm's ``SEModule`` / ``SqueezeExcite``
                                                -> ``fastops.nn.SqueezeExcite``, same FC attribute
                                                   names and state_dict keys (``fastops/nn/squeeze_excite.py``).

Classes fastops does not own (timm's) are recognised by their import path or their structure, never
by importing their package, and their forward is checked against what the swap assumes on a small
probe input before they are replaced.

Each replacement reuses the original's Parameter objects, so ``state_dict`` keys, optimizer state
and checkpoints are unchanged and the outputs agree with the original's. The returned
:class:`SwapReport` lists every replacement (qualified name, old type, new type) and every module
that looked like a candidate but was left alone (with the reason), and can undo the swap:
``report.undo()`` puts the original module objects back, which still hold the same Parameters, so
training done between swap and undo is kept.

A swap never silently changes behaviour:

* A module used in several places (one object) gets one twin, put in each place.

* A candidate that carries its own hooks (forward, forward pre-, backward, state_dict), a
  parametrization (``torch.nn.utils.parametrize``), pruning (``weight_orig`` / ``weight_mask``) or
  ``weight_norm`` / ``spectral_norm`` is left alone and listed in ``report.skipped``: those were
  attached to that module object and would not follow it to the twin. Hooks on modules the swap
  keeps (a parent, an Mlp's ``fc2``) keep firing as before; global module hooks
  (``register_module_forward_hook``) fire on the fastops modules, once per fused module.
* The swap is planned in full before the model is touched: if a rule fails, the model is left
  exactly as it was and the error names the module.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from fastops.swap_rules import PairRule, SwapRule, class_path, overrides, swap_rules, unsafe_to_replace
from fastops.swap_rules import register_swap_rule as register_swap_rule  # where users met it first

FilterFn = Callable[[nn.Module, str], bool]


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
            _carry_buffers(r.new, r.old)
            setattr(r.parent, r.attr, r.old)
        self.undone = True

    def kernel_choices(self) -> list[str]:
        """The kernel choices cached on this machine (:mod:`fastops.tuner`) for the replaced modules'
        ops, in words: per op how many kinds of input run ours and how many PyTorch's, and which."""
        from fastops import tuner

        ops = {op for r in self.replaced for m in r.new.modules() for op in getattr(m, "policy_ops", ())}
        return tuner.describe(sorted(ops)) if ops else []

    def __str__(self) -> str:
        lines = [f"swap_modules: {len(self.replaced)} module(s) replaced"]
        lines += [f"  {r.name}: {r.old_type} -> {r.new_type}" for r in self.replaced]
        lines += [f"  skipped {s.name} ({s.type}): {s.reason}" for s in self.skipped]
        if self.replaced:
            lines.append(
                "  kernel choice: a module times fastops' kernel against PyTorch's the first time it sees a "
                "kind of input on this machine and keeps the faster (fastops.tune(model, example_inputs) "
                "measures ahead of a run)"
            )
            choices = self.kernel_choices()
            lines.append(
                "  choices cached on this machine:" if choices else "  no choice cached on this machine yet"
            )
            lines += [f"    {line}" for line in choices]
        return "\n".join(lines)


def _carry_buffers(twin: nn.Module, original: nn.Module) -> None:
    """Hand the twin's buffers back to the original module where they are no longer the same tensors.

    A twin shares its original's Parameter and buffer objects, but a conversion of the model
    (``.to(device)``, ``.double()``) rebinds each buffer to a new tensor (Parameters are converted in
    place), so after ``model.cuda()`` the original BatchNorm would come back with its old CPU running
    statistics. Buffers are matched by name."""
    twin_buffers = dict(twin.named_buffers())
    for name, buffer in list(original.named_buffers()):
        current = twin_buffers.get(name)
        if current is not None and current is not buffer:
            owner, _, leaf = name.rpartition(".")
            setattr(original.get_submodule(owner) if owner else original, leaf, current)


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
        A :class:`SwapReport` of the replacements and of every candidate left alone, with why;
        ``report.undo()`` restores the original modules.

    Raises:
        RuntimeError: a rule failed on a module (the message names it); the model is unchanged.

    On a timm model::

        model = timm.create_model("convnext_atto")
        report = fastops.swap_modules(model)  # GELUs, Mlp blocks, depthwise convs
        print(report)                         # what was replaced, what was skipped and why

    Modules of classes fastops does not know are recognised through registries a user extends:
    :func:`fastops.nn.register_gelu_module` (a module that computes ``F.gelu``),
    :func:`fastops.nn.register_same_padding_conv2d` (a depthwise conv with TensorFlow "same"
    padding) and, for anything else, :func:`register_swap_rule`. Candidates with hooks,
    parametrizations, pruning or weight norm are skipped (see the module docstring).

    Swap before wrapping the model in DDP / torch.compile and before building the optimizer is the
    simplest order, but because Parameters are reused an existing optimizer keeps working too.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fastops.swap_modules: expected an nn.Module, got {type(model).__name__}")
    rules = swap_rules()
    pair_rules = [r for r in rules if isinstance(r, PairRule)]
    single_rules = [r for r in rules if isinstance(r, SwapRule)]
    keep = filter_fn if filter_fn is not None else (lambda m, n: True)
    report = SwapReport()
    planned: list[Replacement] = []  # nothing is assigned until every module has been decided

    def plan(parent: nn.Module, attr: str, name: str, old: nn.Module, new: nn.Module) -> None:
        new.train(old.training)
        planned.append(Replacement(name, _type_name(old), _type_name(new), parent, attr, old, new))

    def decide_pair(
        parent: nn.Module, prefix: str, children: list[tuple[str, nn.Module]], walked: str | None
    ) -> set[str]:
        """Plan the pair rules over a Sequential's children; returns the attrs they fused. ``walked``:
        why the Sequential's owner may call its children one by one, or None."""
        fused: set[str] = set()
        # Fused, the first module's output is no longer there to see: only nn.Sequential.forward is
        # known to use it solely as the second's input, and only when the Sequential is called whole.
        container = overrides(type(parent), nn.Sequential, "forward")
        container_reason = (
            f"its container {_type_name(parent)} overrides nn.Sequential.forward(), which may use the "
            "output of one apart from the other (fused, that output would change)"
            if container
            else walked
        )
        for (attr, m), (next_attr, nxt) in zip(children, children[1:], strict=False):
            if attr in fused:
                continue
            rule = next((r for r in pair_rules if r.matches(m, nxt)), None)
            if rule is None:
                continue
            name = _qualify(prefix, attr)
            with _naming(rule.name, name, m):
                reason = (
                    container_reason
                    or unsafe_to_replace(m)
                    or _named(next_attr, unsafe_to_replace(nxt))
                    or rule.skip_reason(m, nxt)
                )
                if reason is not None:
                    report.skipped.append(Skipped(name, _type_name(m), reason))
                elif keep(m, name):
                    plan(parent, attr, name, m, rule.replace(m, nxt))
                    plan(parent, next_attr, _qualify(prefix, next_attr), nxt, nn.Identity())
                    fused.update((attr, next_attr))
        return fused

    # A module used in several places (one BatchNorm applied twice) gets one twin, put in every
    # place, so that its state stays shared after the swap and after a conversion of the model.
    twins: dict[int, nn.Module] = {}
    visited: set[int] = set()

    def visit(parent: nn.Module, prefix: str, walked: str | None = None) -> None:
        # Every position, also a module's second one in this parent (named_children() skips it).
        children = [(attr, m) for attr, m in parent._modules.items() if m is not None]
        is_sequential = isinstance(parent, nn.Sequential)
        fused = decide_pair(parent, prefix, children, walked) if is_sequential else set()
        for attr, m in children:
            if attr in fused:
                continue
            name = _qualify(prefix, attr)
            if id(m) in twins:
                plan(parent, attr, name, m, twins[id(m)])
                continue
            rule = next((r for r in single_rules if r.matches(m)), None)
            replaced = False
            if rule is not None:
                with _naming(rule.name, name, m):
                    reason = unsafe_to_replace(m) or rule.skip_reason(m)
                    if reason is not None:
                        report.skipped.append(Skipped(name, _type_name(m), reason))
                    elif keep(m, name):
                        twins[id(m)] = rule.replace(m)
                        plan(parent, attr, name, m, twins[id(m)])
                        replaced = True
            if not replaced and id(m) not in visited:  # a block left alone may hold candidates
                visited.add(id(m))
                owner_walks = (
                    _walked_reason(type(parent).forward, class_path(type(parent)), attr)
                    if isinstance(m, nn.Sequential)
                    else None
                )
                visit(m, name, owner_walks)

    visit(model, "")
    applied: list[Replacement] = []
    try:
        for r in planned:
            setattr(r.parent, r.attr, r.new)
            applied.append(r)
    except BaseException:
        for r in reversed(applied):
            setattr(r.parent, r.attr, r.old)
        raise
    report.replaced = applied
    return report


@functools.lru_cache(maxsize=256)
def _walked_reason(forward: Callable[..., Any], owner: str, attr: str) -> str | None:
    """Why ``forward`` (of class ``owner``) may call the children of its Sequential ``attr`` one by one (to
    collect intermediate features): it uses ``self.<attr>`` other than by calling it (iterates,
    indexes or slices it), or None. Read from the forward's source (a forward without source, as
    a compiled one, counts as calling it)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(forward)))
    except (OSError, TypeError, SyntaxError):
        return None
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == attr
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and id(node) not in called
        ):
            return (
                f"{owner}.forward uses self.{attr} other than by calling it, so it may see "
                "the output of each child (fused, the first one's would change)"
            )
    return None


def _named(child: str, reason: str | None) -> str | None:
    return None if reason is None else f"{child}: {reason}"


@contextmanager
def _naming(rule: str, name: str, module: nn.Module) -> Iterator[None]:
    """Re-raise an error of a rule (or of filter_fn) as one that names the module and the rule, and
    says that the model was left as it was (nothing is assigned before planning ends)."""
    try:
        yield
    except Exception as error:
        where = f"swap rule {rule!r} on {name or '<model>'} ({_type_name(module)})"
        raise RuntimeError(
            f"fastops.swap_modules: {where} failed: {type(error).__name__}: {error}. "
            "Nothing was swapped; the model is unchanged."
        ) from error
