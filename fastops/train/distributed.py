"""DDP plumbing: process-group setup from torchrun's environment, BatchNorm synchronisation, and
small collectives (all-reduce of metric sums, gathering per-rank RNG states)."""

from __future__ import annotations

import datetime
import gc
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

# How long teardown() releases the GIL for gloo's worker threads before the group is destroyed.
_WORKER_DRAIN_S = 0.2


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def setup(device: torch.device, timeout_s: float = 300.0) -> DistInfo:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1), else a single process.

    gloo on the CPU, nccl on CUDA with one GPU per local rank. The timeout bounds every collective,
    so a rank that dies turns into an error on the others instead of a hang.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistInfo(device=device)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def teardown(*, clean_exit: bool = True) -> None:
    """Leave the process group. On a clean exit every rank first meets at a barrier: rank 0 hosts
    the rendezvous store, and a rank still tearing down gloo when rank 0 has already exited dies
    with "terminate called without an active exception" (seen in CI). After an error the barrier
    is skipped, since the other ranks may never arrive.

    Call it after the last DDP/FSDP model is gone, so that the group dies here and not at exit.
    gloo's worker threads drop a finished work while holding the group's mutex, and dropping a
    tensor whose Python object has died takes the GIL; the group's destructor takes that mutex
    while holding the GIL. A rank that destroyed the group right after a collective hung at exit
    that way (seen in CI: ~Reducer -> ~ProcessGroupGloo against pt_gloo_runloop). The pause
    releases the GIL so that the workers finish dropping what they hold first.
    """
    if dist.is_available() and dist.is_initialized():
        if clean_exit:
            dist.barrier()
        time.sleep(_WORKER_DRAIN_S)
        dist.destroy_process_group()
        gc.collect()  # a group kept alive by a reference cycle dies now, not at interpreter exit


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_sum(t: Tensor, info: DistInfo) -> Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_objects(obj: object, info: DistInfo) -> list[object]:
    if not info.enabled:
        return [obj]
    out: list[object] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


class GlooSyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics are taken over the global batch of all ranks (CPU/gloo).

    torch's nn.SyncBatchNorm only runs on GPUs; this is its CPU counterpart: per-channel sums are
    all-reduced with the autograd-aware ``torch.distributed.nn.functional.all_reduce`` (whose
    backward all-reduces the gradients), so the forward and the gradients equal those of a single
    process on the concatenated batch. Same Parameters and buffers as nn.BatchNorm2d, so the
    state_dict is unchanged. Two all-reduces per layer per step: fine for the CPU, where it is used.
    """

    @classmethod
    def from_batchnorm(cls, bn: nn.BatchNorm2d) -> GlooSyncBatchNorm:
        new = cls.__new__(cls)
        new.__dict__ = bn.__dict__.copy()  # shares the same Parameter and buffer objects
        new._parameters = bn._parameters.copy()
        new._buffers = bn._buffers.copy()
        new._modules = bn._modules.copy()
        return new

    def forward(self, x: Tensor) -> Tensor:
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(x)
        from torch.distributed.nn.functional import all_reduce

        c = x.shape[1]
        xf = x.float()
        stats = torch.cat([xf.sum((0, 2, 3)), torch.full((1,), float(xf.numel() // c), dtype=xf.dtype)])
        stats = all_reduce(stats)
        n = stats[c]
        mean = stats[:c] / n
        centred = xf - mean[None, :, None, None]
        var = all_reduce(centred.square().sum((0, 2, 3))) / n
        y = centred * torch.rsqrt(var + self.eps)[None, :, None, None]
        if self.affine:
            y = y * self.weight[None, :, None, None] + self.bias[None, :, None, None]
        if self.track_running_stats:
            assert self.running_mean is not None and self.running_var is not None
            assert self.num_batches_tracked is not None
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                momentum = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                unbiased = var * (n / (n - 1).clamp(min=1))
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), momentum)
        return y.to(x.dtype)


class GlooSyncBatchNormAct2d(GlooSyncBatchNorm):
    """:class:`GlooSyncBatchNorm`, then the norm-act module's own ``drop`` and ``act`` (timm's and
    fastops' ``BatchNormAct2d``): their children come along with ``from_batchnorm``."""

    drop: nn.Module
    act: nn.Module

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.drop(super().forward(x)))


class SyncBatchNormAct2d(nn.SyncBatchNorm):
    """``nn.SyncBatchNorm``, then the norm-act module's own ``drop`` and ``act``. torch's
    ``convert_sync_batchnorm`` turns a ``BatchNormAct2d`` into a plain SyncBatchNorm that keeps those
    children but never calls them (the activation silently gone); this class is what it should
    have made, reached by changing the class of torch's own conversion."""

    drop: nn.Module
    act: nn.Module

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.drop(super().forward(x)))


def _is_norm_act(m: nn.Module) -> bool:
    """A batch norm followed by its own ``drop`` and ``act`` children: fastops' BatchNormAct2d and
    the classes its swap rule recognises (timm's)."""
    from fastops.nn.batch_norm import _NORM_ACT_CLASSES, BatchNormAct2d
    from fastops.swap_rules import class_path

    known = isinstance(m, BatchNormAct2d) or class_path(type(m)) in _NORM_ACT_CLASSES
    return known and {name for name, _ in m.named_children()} == {"drop", "act"}


def _convert_sync(module: nn.Module) -> nn.Module:
    """``nn.SyncBatchNorm.convert_sync_batchnorm``, but a norm-act module keeps its activation."""
    if _is_norm_act(module):
        converted = nn.SyncBatchNorm.convert_sync_batchnorm(module)
        converted.__class__ = SyncBatchNormAct2d
        return converted
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for name, child in list(module.named_children()):
        setattr(module, name, _convert_sync(child))
    return module


def sync_batchnorm(model: nn.Module, device: torch.device) -> nn.Module:
    """Make BatchNorm layers compute their statistics over the global batch (DDP with BN); a
    norm-act layer (``BatchNormAct2d``) stays one, its activation after the synced batch norm."""
    if device.type == "cuda":
        return _convert_sync(model)

    from fastops.nn.batch_norm import BatchNorm2d  # swap_modules' twin: the same module, our kernels

    def convert(parent: nn.Module) -> None:
        for name, child in parent.named_children():
            # The fastops twin too: its statistics are per rank like the stock module's.
            if _is_norm_act(child):
                setattr(parent, name, GlooSyncBatchNormAct2d.from_batchnorm(child))  # type: ignore[arg-type]
            elif isinstance(child, nn.BatchNorm2d) and type(child) in (nn.BatchNorm2d, BatchNorm2d):
                setattr(parent, name, GlooSyncBatchNorm.from_batchnorm(child))
            else:
                convert(child)

    convert(model)
    return model


def shard_fsdp2(model: nn.Module, blocks: Sequence[nn.Module], *, amp_dtype: torch.dtype | None) -> None:
    """FSDP2: ``fully_shard`` each block, then the root (which takes the parameters no block holds).

    Each block's parameters are all-gathered just before its forward and freed after it, so at most
    about one block is unsharded at a time. Under AMP the parameters are gathered in the autocast
    dtype and the gradients reduced in fp32 (MixedPrecisionPolicy). The ranks start from rank 0's
    weights and buffers, as DDP would make them: fully_shard itself does not broadcast.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t, src=0)
    policy = MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)
    if amp_dtype is not None:
        # BatchNorm keeps fp32 weights, as under autocast: in eval mode its fp32 running
        # statistics and low-precision weights would meet in one kernel, which refuses the mix.
        fp32 = MixedPrecisionPolicy(reduce_dtype=torch.float32)
        for norm in model.modules():
            if isinstance(norm, nn.modules.batchnorm._BatchNorm):
                fully_shard(norm, mp_policy=fp32)
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


class Weighted(NamedTuple):
    batch: Any
    weight: float


def padded_batches(loader: Iterable[Any], info: DistInfo) -> Iterator[Any]:
    """The loader's batches, then, on a rank with fewer than the most, its last batch again with
    weight 0 until every rank has yielded as many: for models (FSDP2) whose forward is a collective."""
    count = torch.tensor([len(loader)])  # type: ignore[arg-type]
    if info.enabled:
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
    last = None
    n = 0
    for batch in loader:
        last = batch
        n += 1
        yield batch
    if last is None and int(count) > 0:
        raise RuntimeError(
            f"fastops.train: rank {info.rank} has no evaluation batch while another has; "
            "give the evaluation set at least one sample per process"
        )
    for _ in range(int(count) - n):
        yield Weighted(last, 0.0)
