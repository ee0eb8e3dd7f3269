"""Activation checkpointing of one block, with BatchNorm running statistics updated exactly once."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

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
