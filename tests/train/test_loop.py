"""One training step: gradient accumulation with no_sync, the fp16 GradScaler's skip logic, activation
checkpointing, and the Liger-style convergence check (same seed, with and without swap)."""

from __future__ import annotations

import contextlib
import copy
import functools

import pytest
import torch
import torch.distributed as dist
from torch import nn

import fastops
from fastops.train import amp, train_step
from fastops.train.activation_checkpointing import checkpoint_blocks, find_blocks
from fastops.train.model import ConvNet, SeparableBlock
from fastops.train.trainer import make_optimizer
from tests.train.common import tiny_config


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.Linear(32, 5))


def _data(n: int, d: int = 10, classes: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, d), torch.randint(0, classes, (n,))


@contextlib.contextmanager
def _single_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_no_sync_accumulation_equals_one_large_batch(tmp_path) -> None:
    torch.manual_seed(0)
    ref = _mlp()
    model = copy.deepcopy(ref)
    x, y = _data(48)
    noscale = amp.make_scaler("none", torch.device("cpu"))
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    train_step(
        ref, [(x, y)], optimizer=opt_ref, scaler=noscale, autocast=contextlib.nullcontext, grad_clip=0.5
    )

    with _single_process_group(tmp_path):
        ddp = nn.parallel.DistributedDataParallel(model)
        reductions = []

        def count_allreduce(state, bucket):
            reductions.append(bucket.index())
            fut: torch.futures.Future = torch.futures.Future()
            fut.set_result(bucket.buffer())  # world size 1: the reduced buffer is the buffer
            return fut

        ddp.register_comm_hook(None, count_allreduce)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        micro = [(x[i : i + 12], y[i : i + 12]) for i in range(0, 48, 12)]
        result = train_step(
            ddp, micro, optimizer=opt, scaler=noscale, autocast=contextlib.nullcontext, grad_clip=0.5
        )
    # One all-reduce per bucket for the whole step, not one per micro-batch.
    assert len(reductions) == len(set(reductions)) >= 1
    ref_loss = nn.functional.cross_entropy(copy.deepcopy(ref).eval()(x), y)  # only to check the type
    assert result.loss.shape == ref_loss.shape
    assert int(result.metric) <= 48
    for p, q in zip(ddp.module.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_fp16_gradscaler_skips_inf_step_and_backs_off() -> None:
    """The fp16 path of train_step on the CPU (torch.amp.GradScaler("cpu") and fp16 autocast exist
    there); the CLI still requires CUDA for --amp fp16."""
    torch.manual_seed(0)
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1000)
    autocast = functools.partial(torch.autocast, "cpu", dtype=torch.float16)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = _data(16)
    bad = x.clone()
    bad[3, 2] = float("inf")

    result = train_step(model, [(bad, y)], optimizer=opt, scaler=scaler, autocast=autocast, grad_clip=1.0)
    assert not torch.isfinite(result.loss)
    assert scaler.get_scale() == 2.0**9  # backed off by the default factor 0.5
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)  # the step was skipped
    assert all(len(s) == 0 for s in opt.state.values())  # and AdamW never ran

    result = train_step(model, [(x, y)], optimizer=opt, scaler=scaler, autocast=autocast, grad_clip=1.0)
    assert torch.isfinite(result.loss)
    assert scaler.get_scale() == 2.0**9
    assert any(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 autocast + GradScaler on CUDA")
def test_fp16_gradscaler_cuda() -> None:
    device = torch.device("cuda")
    model = _mlp().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = amp.make_scaler("fp16", device, init_scale=2.0**10)
    x, y = (t.to(device) for t in _data(16))
    x[0, 0] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    train_step(model, [(x, y)], optimizer=opt, scaler=scaler, autocast=lambda: amp.autocast("fp16", device))
    assert scaler.get_scale() == 2.0**9
    for p, b in zip(model.parameters(), before, strict=True):
        assert torch.equal(p, b)


def test_bf16_autocast_step_runs_without_scaler() -> None:
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = amp.make_scaler("bf16", torch.device("cpu"))
    assert not scaler.is_enabled()
    r = train_step(
        model,
        [_data(8)],
        optimizer=opt,
        scaler=scaler,
        autocast=lambda: amp.autocast("bf16", torch.device("cpu")),
    )
    assert torch.isfinite(r.loss)


@pytest.mark.parametrize("use_fastops", [False, True], ids=["stock", "fastops"])
def test_activation_checkpointing_equal_grads_and_bn_stats(use_fastops: bool) -> None:
    torch.manual_seed(0)
    plain = ConvNet(1, 10, image_size=16, width=8, dropout=0.2)
    if use_fastops:
        fastops.swap_modules(plain)
    ckpt = copy.deepcopy(plain)
    assert checkpoint_blocks(ckpt, [SeparableBlock]) == [f"blocks.{i}" for i in range(len(ckpt.blocks))]
    calls = []
    ckpt.blocks[0].dw.register_forward_pre_hook(lambda *a: calls.append(1))
    x, y = torch.randn(6, 1, 16, 16), torch.randint(0, 10, (6,))
    grads = {}
    for name, model in (("plain", plain), ("ckpt", ckpt)):
        torch.manual_seed(1)
        nn.functional.cross_entropy(model(x), y).backward()
        grads[name] = {n: p.grad for n, p in model.named_parameters()}
    assert len(calls) == 2  # the block ran again in backward: it really was checkpointed
    for n, g in grads["plain"].items():
        torch.testing.assert_close(grads["ckpt"][n], g, msg=n)
    # BatchNorm folded the batch into its running stats exactly once.
    for (n, b), c in zip(plain.named_buffers(), ckpt.buffers(), strict=True):
        torch.testing.assert_close(c, b, msg=n, rtol=0, atol=0)
    assert list(ckpt.state_dict()) == list(plain.state_dict())  # checkpoints stay interchangeable


def test_same_seed_with_and_without_swap_gives_matching_losses(tmp_path) -> None:
    """Liger-style convergence check: fastops modules + FusedAdamW track stock modules + AdamW step
    for step on the main job's model and data."""
    from fastops.train.data import digits_tensors

    x, y = digits_tensors(8)["train"]
    losses = {}
    for use_fastops in (False, True):
        cfg = tiny_config(tmp_path, fastops=use_fastops, lr=1e-2)
        torch.manual_seed(0)
        model = ConvNet(1, 10, image_size=8, width=16, dropout=0.0)
        if use_fastops:
            fastops.swap_modules(model)
        opt = make_optimizer(model, cfg)
        scaler = amp.make_scaler("none", torch.device("cpu"))
        run = []
        for step in range(30):
            i = (step * 32) % (len(y) - 32)
            r = train_step(
                model,
                [(x[i : i + 32], y[i : i + 32])],
                optimizer=opt,
                scaler=scaler,
                autocast=contextlib.nullcontext,
                grad_clip=1.0,
            )
            run.append(float(r.loss))
        losses[use_fastops] = torch.tensor(run)
    assert losses[False][-5:].mean() < 0.6 * losses[False][:5].mean()  # it does learn
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-4, atol=1e-5)


def test_blocks_are_found_by_name_class_name_or_class_outermost_only() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.GELU()), nn.Sequential(nn.Linear(2, 2)))
    assert [n for n, _ in find_blocks(model, ["1", "0"])] == ["0", "1"]
    assert [n for n, _ in find_blocks(model, ["Sequential"])] == ["0", "1"]  # not the root
    assert [n for n, _ in find_blocks(model, [nn.Sequential, nn.Linear])] == ["0", "1"]
    assert [n for n, _ in find_blocks(model, ["Linear"])] == ["0.0", "1.0"]
    with pytest.raises(ValueError, match="'layer9' names no submodule of Sequential"):
        find_blocks(model, ["layer9"])
    with pytest.raises(ValueError, match="blocks must be a non-empty list"):
        find_blocks(model, "0")


def test_accumulation_skips_the_gradient_sync_of_all_but_the_last_micro_batch_under_fsdp2() -> None:
    """FSDP2 modules have no no_sync(); the step turns their gradient sync off for every micro-batch
    but the last (and back on, even when a backward raises)."""
    calls: list[bool] = []

    class FakeFSDP2(nn.Linear):
        def set_requires_gradient_sync(self, requires: bool) -> None:
            calls.append(requires)

    model = FakeFSDP2(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.randn(2, 4), torch.randint(0, 3, (2,))) for _ in range(3)]
    train_step(
        model,
        batches,
        optimizer=opt,
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        autocast=contextlib.nullcontext,
    )
    assert calls == [False, True, False, True]  # off/on around micro-batches 1 and 2; 3 syncs
