"""swap_modules: replace stock PyTorch modules of a live model with their fastops twins, in place.

What is swapped (each replacement reuses the original's Parameter objects, so ``state_dict`` keys,
optimizer state and checkpoints are unchanged and the outputs agree with the original's):

* ``nn.GELU``                                   -> ``fastops.nn.GELU``
* depthwise ``nn.Conv2d`` (groups == in == out channels, zero padding) -> ``fastops.nn.DepthwiseConv2d``
* ``nn.Linear`` directly followed by ``nn.GELU`` inside an ``nn.Sequential``
                                                -> ``fastops.nn.LinearGELU`` at the Linear's index and
                                                   ``nn.Identity`` at the GELU's, so the indices, and
                                                   therefore the keys ``<seq>.<i>.weight``, stay put.

The returned :class:`SwapReport` lists every replacement (qualified name, old type, new type) and
every module that looked like a candidate but was left alone (with the reason), and can undo the
swap: ``report.undo()`` puts the original module objects back, which still hold the same
Parameters, so training done between swap and undo is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

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


def _depthwise_skip_reason(conv: nn.Conv2d) -> str | None:
    """None when conv is a depthwise conv that fastops.nn.DepthwiseConv2d can take over."""
    if not (conv.groups == conv.in_channels == conv.out_channels):
        return "not depthwise"  # a dense or grouped conv: not a candidate at all
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode!r} (only 'zeros' is supported)"
    return None


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
    import fastops.nn as fnn

    # Each kind is swapped when this build of fastops has its module (all do in a release).
    gelu_cls = getattr(fnn, "GELU", None)
    dw_cls = getattr(fnn, "DepthwiseConv2d", None)
    linear_gelu_cls = getattr(fnn, "LinearGELU", None)

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
        fused: set[str] = set()  # attrs of Linear->GELU pairs of a Sequential, already replaced
        if isinstance(parent, nn.Sequential):
            for (attr, m), (next_attr, nxt) in zip(children, children[1:], strict=False):
                if (
                    linear_gelu_cls is not None
                    and type(m) is nn.Linear
                    and type(nxt) is nn.GELU
                    and attr not in fused
                    and keep(m, _qualify(prefix, attr))
                ):
                    replace(parent, attr, _qualify(prefix, attr), m, linear_gelu_cls.from_torch(m, nxt))
                    replace(parent, next_attr, _qualify(prefix, next_attr), nxt, nn.Identity())
                    fused.update((attr, next_attr))
        for attr, m in children:
            name = _qualify(prefix, attr)
            if attr in fused:
                continue
            # Exact types only: a subclass may override forward(), which a swap would silently drop.
            if type(m) is nn.GELU and gelu_cls is not None:
                if keep(m, name):
                    replace(parent, attr, name, m, gelu_cls.from_torch(m))
            elif type(m) is nn.Conv2d and dw_cls is not None:
                reason = _depthwise_skip_reason(m)
                if reason is None:
                    if keep(m, name):
                        replace(parent, attr, name, m, dw_cls.from_torch(m))
                elif reason != "not depthwise":
                    report.skipped.append(Skipped(name, _type_name(m), reason))
            else:
                visit(m, name)

    visit(model, "")
    return report
