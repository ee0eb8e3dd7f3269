"""One optimizer step, as a function of its parts: the story every training step of fastops.train tells.

A batch is a ``(inputs, targets, ...)`` tuple or list: the model is called on ``batch[0]``, and the
loss and metric functions get the model's outputs and the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

Batch = Sequence[Any]  # (inputs, targets, ...)
LossFn = Callable[[Any, Batch], Tensor]  # (outputs, batch) -> the mean loss over the batch
MetricFn = Callable[[Any, Batch], Tensor]  # (outputs, batch) -> the metric summed over the batch's samples


def model_inputs(batch: Batch) -> Any:
    """What the model is called on: the first element of a ``(inputs, targets, ...)`` batch."""
    if not isinstance(batch, (tuple, list)) or not batch:
        raise TypeError(
            "fastops.train: a batch must be a non-empty (inputs, targets, ...) tuple or list, "
            f"got {type(batch).__name__}"
        )
    return batch[0]


def batch_size_of(batch: Batch) -> int:
    """Samples in a batch: the length of its inputs."""
    return len(model_inputs(batch))


def _logits(outputs: Any, default: str, argument: str) -> Tensor:
    """The defaults take a tensor of logits; a model returning a tuple or dict needs its own."""
    if not isinstance(outputs, Tensor):
        raise TypeError(
            f"fastops.train: the default {default} needs the model to return a tensor of logits, but it "
            f"returned a {type(outputs).__name__}; pass {argument}=fn(outputs, batch) to fit()"
        )
    return outputs


def cross_entropy_loss(outputs: Tensor, batch: Batch) -> Tensor:
    """The default loss: cross-entropy of the logits (in fp32, also under autocast) and ``batch[1]``."""
    return nn.functional.cross_entropy(_logits(outputs, "loss (cross-entropy)", "loss_fn").float(), batch[1])


def accuracy_sum(outputs: Tensor, batch: Batch) -> Tensor:
    """The default metric: how many samples' argmax logit is their ``batch[1]`` class."""
    return (_logits(outputs, "metric (accuracy)", "metric_fn").detach().argmax(-1) == batch[1]).sum()


@dataclass
class StepResult:
    loss: Tensor  # mean loss over the micro-batches, detached, on the device (no host sync)
    metric: Tensor  # metric_fn summed over the step's samples (correct predictions by default), on the device


def train_step(
    model: nn.Module,
    micro_batches: Sequence[Batch],
    *,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    autocast: Callable[[], AbstractContextManager],
    loss_fn: LossFn = cross_entropy_loss,
    metric_fn: MetricFn = accuracy_sum,
    grad_clip: float = 0.0,
) -> StepResult:
    """Forward/backward over ``micro_batches`` (gradient accumulation), then one optimizer step.

    ``model`` may be wrapped in DDP or sharded with FSDP2; ``scaler`` is a GradScaler, disabled
    unless training in fp16. Nothing here reads a value back to the host, so the CPU can run ahead
    of the GPU.
    """
    # set_to_none: the first backward writes the gradients instead of adding to zero-filled
    # tensors, which saves a memset and a read of every gradient each step.
    optimizer.zero_grad(set_to_none=True)
    n = len(micro_batches)
    device = next(t for t in _tensors(micro_batches[0])).device
    loss_sum = torch.zeros((), device=device)
    metric = torch.zeros((), device=device)
    for i, batch in enumerate(micro_batches):
        # No gradient sync on all but the last micro-batch: DDP and FSDP2 then only accumulate
        # gradients locally, and the one all-reduce (reduce-scatter) of the step overlaps with the
        # last micro-batch's backward.
        with nullcontext() if i == n - 1 else _without_grad_sync(model):
            with autocast():
                outputs = model(model_inputs(batch))
                # Divided by n so that the accumulated gradient is that of the mean over all
                # micro-batches, i.e. of one large batch.
                loss = loss_fn(outputs, batch) / n
            # The scaler multiplies the fp16 loss by its scale so small gradients do not flush to
            # zero; for bf16/fp32 it is disabled and returns the loss as is.
            scaler.scale(loss).backward()
        loss_sum += loss.detach()
        with torch.no_grad():
            metric += metric_fn(outputs, batch)
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
    return StepResult(loss_sum, metric)


@contextmanager
def _without_grad_sync(model: nn.Module) -> Iterator[None]:
    """DDP's ``no_sync()``; for an FSDP2 module, ``set_requires_gradient_sync(False)`` (FSDP2 has no
    ``no_sync``: it then keeps unsharded gradients until the synced backward); else nothing."""
    # Any: DDP and FSDPModule methods, looked up by name (nn.Module's __getattr__ types them as Tensor).
    wrapped: Any = model
    if hasattr(wrapped, "no_sync"):
        with wrapped.no_sync():
            yield
    elif hasattr(wrapped, "set_requires_gradient_sync"):
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)
    else:
        yield


def _tensors(batch: Batch) -> list[Tensor]:
    found = [t for t in batch if isinstance(t, Tensor)]
    if not found:
        raise TypeError("fastops.train: a batch must hold at least one tensor")
    return found
