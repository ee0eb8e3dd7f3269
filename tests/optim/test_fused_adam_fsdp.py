"""FusedAdamW on DTensor params: FSDP2 (fully_shard) over two gloo processes trains like one process
with torch.optim.AdamW on the same global batch, and its sharded state round-trips through
torch.distributed.checkpoint."""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile

import pytest
import torch
from torch import nn

from tests.helpers import leave_spawned_worker

STEPS = 4
GLOBAL_BATCH = 8
HYPER = dict(lr=1e-2, weight_decay=0.1)


def _model() -> nn.Module:
    torch.manual_seed(0)
    # Leading dims 16 and 4 split evenly over 2 ranks; the biases of 4 give each rank 2 elements.
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)  # the same global batches on every rank and in the reference
    return [
        (torch.randn(GLOBAL_BATCH, 8, generator=g), torch.randint(0, 4, (GLOBAL_BATCH,), generator=g))
        for _ in range(count)
    ]


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def _accumulated_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    """The training loop's step on two micro-batches: FSDP2 skips the gradient sync of the first
    (set_requires_gradient_sync), and the accumulated step must still equal the full batch's."""
    from fastops.train.loop import train_step

    half = x.shape[0] // 2
    train_step(
        model,
        [(x[:half], y[:half]), (x[half:], y[half:])],
        optimizer=opt,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        autocast=contextlib.nullcontext,
    )


def _sharded(rank: int):
    from torch.distributed.fsdp import fully_shard

    from fastops.optim import FusedAdamW

    model = _model()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return model, FusedAdamW(model.parameters(), **HYPER)


def _fsdp_worker(rank: int, world_size: int, out_dir: str) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.tensor import DTensor

    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(out_dir, 'rendezvous')}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        batches = _batches(STEPS + 1)
        mine = slice(rank * GLOBAL_BATCH // world_size, (rank + 1) * GLOBAL_BATCH // world_size)
        model, opt = _sharded(rank)
        for x, y in batches[:STEPS]:
            _accumulated_step(model, opt, x[mine], y[mine])
        state = opt.state[next(model.parameters())]
        assert isinstance(state["exp_avg"], DTensor) and isinstance(state["exp_avg_sq"], DTensor)
        trained = {n: p.full_tensor() for n, p in model.named_parameters()}

        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(out_dir, "ckpt"))
        x, y = batches[STEPS]
        _step(model, opt, x[mine], y[mine])
        continued = {n: p.full_tensor() for n, p in model.named_parameters()}

        # A fresh sharded model and optimizer, restored from the checkpoint, take the same step.
        model2, opt2 = _sharded(rank)
        msd2, osd2 = get_state_dict(model2, opt2)
        loaded = {"model": msd2, "optim": osd2}
        dcp.load(loaded, checkpoint_id=os.path.join(out_dir, "ckpt"))
        set_state_dict(model2, opt2, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
        _step(model2, opt2, x[mine], y[mine])
        resumed = {n: p.full_tensor() for n, p in model2.named_parameters()}
        if rank == 0:
            torch.save(
                {"trained": trained, "continued": continued, "resumed": resumed},
                os.path.join(out_dir, "out.pt"),
            )
        dist.barrier()  # neither rank tears down while the other is still talking
    finally:
        dist.destroy_process_group()
    leave_spawned_worker()


def test_fsdp2_fused_adamw_equals_one_process_adamw_and_resumes_through_dcp() -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(_fsdp_worker, args=(2, out_dir), nprocs=2, join=False, start_method="spawn")
        waited = 0.0
        while not ctx.join(timeout=5):
            waited += 5
            if waited >= 120:
                for proc in ctx.processes:
                    proc.kill()
                pytest.fail("FSDP2 workers did not finish within 120 s")
        out = torch.load(os.path.join(out_dir, "out.pt"))

    ref = _model()
    opt = torch.optim.AdamW(ref.parameters(), **HYPER, foreach=False)
    for x, y in _batches(STEPS):
        _step(ref, opt, x, y)
    for name, p in ref.named_parameters():
        # The two halves' mean gradient (reduce-scatter) equals the full batch's up to rounding.
        torch.testing.assert_close(out["trained"][name], p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    for name, p in out["continued"].items():
        assert torch.equal(out["resumed"][name], p), name  # resumed from DCP: bitwise the same step
