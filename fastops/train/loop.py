"""One optimizer step, as a function of its parts: the story every training step of fastops.train tells."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class StepResult:
    loss: Tensor  # mean loss over the micro-batches, detached, on the device (no host sync)
    correct: Tensor  # number of correctly classified samples, on the device


def train_step(
    model: nn.Module,
    micro_batches: Sequence[tuple[Tensor, Tensor]],
    *,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    autocast: Callable[[], AbstractContextManager],
    loss_fn: Callable[[Tensor, Tensor], Tensor] = nn.functional.cross_entropy,
    grad_clip: float = 0.0,
) -> StepResult:
    """Forward/backward over ``micro_batches`` (gradient accumulation), then one optimizer step.

    ``model`` may be wrapped in DDP; ``scaler`` is a GradScaler, disabled unless training in fp16.
    Nothing here reads a value back to the host, so the CPU can run ahead of the GPU.
    """
    # set_to_none: the first backward writes the gradients instead of adding to zero-filled
    # tensors, which saves a memset and a read of every gradient each step.
    optimizer.zero_grad(set_to_none=True)
    n = len(micro_batches)
    loss_sum = torch.zeros((), device=micro_batches[0][0].device)
    correct = torch.zeros((), dtype=torch.int64, device=micro_batches[0][0].device)
    for i, (x, y) in enumerate(micro_batches):
        # no_sync on all but the last micro-batch: DDP then only accumulates gradients locally,
        # and the one all-reduce of the step overlaps with the last micro-batch's backward.
        sync = i == n - 1 or not hasattr(model, "no_sync")
        with nullcontext() if sync else model.no_sync():  # type: ignore[operator]
            with autocast():
                logits = model(x)
                # Divided by n so that the accumulated gradient is that of the mean over all
                # micro-batches, i.e. of one large batch.
                loss = loss_fn(logits.float(), y) / n
            # The scaler multiplies the fp16 loss by its scale so small gradients do not flush to
            # zero; for bf16/fp32 it is disabled and returns the loss as is.
            scaler.scale(loss).backward()
        loss_sum += loss.detach()
        correct += (logits.detach().argmax(1) == y).sum()
    if grad_clip > 0:
        # Unscale before clipping: the threshold is in units of the true gradient, not of the
        # scaled one. unscale_ also records (on the device) whether any gradient is inf/NaN.
        scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    # With fp16, step() skips optimizer.step() when the gradients held an inf/NaN, and update()
    # then halves the scale; otherwise both are plain optimizer.step() / no-ops.
    scaler.step(optimizer)
    scaler.update()
    return StepResult(loss_sum, correct)
