"""Activation checkpointing of a model's blocks, with BatchNorm running statistics updated exactly once.

The blocks are named by the user (:func:`find_blocks`): qualified submodule names, class names or
classes. The same blocks are FSDP2's sharding units (``fully_shard`` per block, then the root).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint


class _KeepBatchNormStats(AbstractContextManager):
    """Restores the BN running stats of a block after the backward pass recomputed its forward.

    Why: the recomputation runs the block in training mode a second time, and BatchNorm would fold
    the same batch into running_mean/var twice (and count it twice), so a checkpointed run would
    drift from an uncheckpointed one. The batch statistics used for normalization are recomputed
    from the same input, so the gradients are unaffected.
    """

    def __init__(self, block: nn.Module) -> None:
        self.block = block
        self.saved: list[tuple[object, list]] = []

    def __enter__(self) -> _KeepBatchNormStats:
        self.saved = [
            (m, [b.clone() if b is not None else None for b in _stats(m)])
            for m in self.block.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        ]
        return self

    def __exit__(self, *exc: object) -> None:
        for m, copies in self.saved:
            for live, copy in zip(_stats(m), copies, strict=True):  # type: ignore[arg-type]
                if live is not None:
                    live.copy_(copy)
        self.saved = []


def _stats(m: nn.Module) -> list:
    return [m.running_mean, m.running_var, m.num_batches_tracked]


def checkpoint_block(block: nn.Module, x: Tensor) -> Tensor:
    """``block(x)`` without keeping its intermediate activations for backward.

    use_reentrant=False: the non-reentrant implementation supports inputs that do not require
    grad, keyword arguments, torch.compile and DDP, and is the one PyTorch recommends. The RNG
    state is preserved (default), so dropout inside the block draws the same mask when recomputed.
    """
    if torch.compiler.is_compiling():
        # Traced into the graph: the recomputation runs inside the compiled backward, which does
        # not replay the forward's buffer writes, so there is nothing to restore (and Dynamo only
        # accepts plain functions as context_fn).
        return checkpoint(block, x, use_reentrant=False)
    return checkpoint(
        block,
        x,
        use_reentrant=False,
        context_fn=lambda: (nullcontext(), _KeepBatchNormStats(block)),
    )


BlockSpec = (
    str | type[nn.Module]
)  # a qualified submodule name ("layer1", "blocks.0"), a class name, or a class


def find_blocks(model: nn.Module, blocks: Sequence[BlockSpec]) -> list[tuple[str, nn.Module]]:
    """The submodules of ``model`` that ``blocks`` names, outermost first, none inside another.

    A string matches a submodule's qualified name (as in ``named_modules()``) or its class name
    (``"Bottleneck"``, ``"Sequential"``); a class matches its instances. The model itself never
    matches. Raises ValueError naming a spec that matches nothing, so a typo is not a silent no-op.
    """
    if isinstance(blocks, (str, type)) or not blocks:
        raise ValueError(
            "fastops.train: blocks must be a non-empty list of submodule names, class names or "
            f"classes, got {blocks!r}"
        )

    def matches(spec: BlockSpec, name: str, module: nn.Module) -> bool:
        if isinstance(spec, str):
            return spec in (name, type(module).__name__)
        return isinstance(module, spec)

    found: list[tuple[str, nn.Module]] = []
    used: set[int] = set()
    for spec in blocks:
        if not isinstance(spec, (str, type)):
            raise ValueError(f"fastops.train: blocks: expected a name or an nn.Module class, got {spec!r}")
        hits = [(n, m) for n, m in model.named_modules() if n and matches(spec, n, m)]
        if not hits:
            raise ValueError(
                f"fastops.train: blocks: {getattr(spec, '__name__', spec)!r} names no submodule of "
                f"{type(model).__name__} (give qualified names from model.named_modules(), or class names)"
            )
        for n, m in hits:
            if id(m) not in used:
                used.add(id(m))
                found.append((n, m))
    # Outermost only: a block inside another block is recomputed (and sharded) with its parent.
    names = [n for n, _ in found]
    outer = [(n, m) for n, m in found if not any(n.startswith(p + ".") for p in names)]
    order = {n: i for i, (n, _) in enumerate(model.named_modules())}
    return sorted(outer, key=lambda nm: order[nm[0]])


def _checkpointed_forward(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
    forward = functools.partial(type(block).forward, block)
    if not (block.training and torch.is_grad_enabled()):
        return forward(*args, **kwargs)
    if torch.compiler.is_compiling():
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return checkpoint(
        forward,
        *args,
        use_reentrant=False,
        context_fn=lambda: (nullcontext(), _KeepBatchNormStats(block)),
        **kwargs,
    )


def checkpoint_blocks(model: nn.Module, blocks: Sequence[BlockSpec]) -> list[str]:
    """Activation-checkpoint each block :func:`find_blocks` finds, in place; returns their names.

    Each block's ``forward`` is replaced on the instance (not the module by a wrapper), so the
    state_dict keys stay those of the plain model and checkpoints stay interchangeable. In training
    mode with grad enabled the block runs under non-reentrant ``torch.utils.checkpoint``, as
    :func:`checkpoint_block` does; in eval or no_grad it runs as it is.
    """
    found = find_blocks(model, blocks)
    for _, block in found:
        block.forward = functools.partial(_checkpointed_forward, block)  # type: ignore[method-assign]
    return [n for n, _ in found]
