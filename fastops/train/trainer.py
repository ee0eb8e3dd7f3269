"""Trainer: trains any nn.Module on a Dataset or DataLoader, with the loop's whole story (AMP,
activation checkpointing, DDP or FSDP2, atomic checkpoints, exact resume, early stopping, records).

Library: ``fastops.train.fit(model, train_data, val_data, epochs=5)``; the bundled job (a convnet of
fastops blocks on digits) is ``fastops.train.run(TrainConfig(...))``, which the CLI
(``python -m fastops.train``, ``torchrun ... -m fastops.train``) calls.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from fastops.swap import swap_modules
from fastops.train import amp, checkpoint, distributed, extras
from fastops.train.activation_checkpointing import BlockSpec, checkpoint_blocks, find_blocks
from fastops.train.config import ConfigError, TrainConfig
from fastops.train.data import build_data, eval_loader, random_translate, train_loader
from fastops.train.loop import (
    Batch,
    LossFn,
    MetricFn,
    accuracy_sum,
    batch_size_of,
    cross_entropy_loss,
    model_inputs,
    train_step,
)
from fastops.train.metrics import EarlyStopping, MetricsWriter, peak_memory_mb, write_json
from fastops.train.model import SeparableBlock, model_from_config

# What train_data/val_data/test_data may be: a Dataset (we build the loader) or a ready loader.
TrainData = Dataset | DataLoader | Iterable[Batch]

# Settings a resumed run must share with the run that wrote the checkpoint: they fix the model's
# shape, the data order and the length of the learning-rate schedule.
RESUME_INVARIANTS = (
    "model",
    "dataset",
    "image_size",
    "num_classes",
    "width",
    "epochs",
    "batch_size",
    "accum_steps",
)


class NonFiniteLossError(RuntimeError):
    """Training became NaN or inf: the training or (with --nonfinite stop) validation loss, or the
    weights or optimizer state, which no checkpoint is ever written from."""


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices and conv kernels; not biases or BatchNorm affine parameters (1-D tensors)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = _param_groups(model, cfg.weight_decay)
    if cfg.fastops:
        from fastops.optim import FusedAdamW

        return FusedAdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)


class Trainer:
    """Trains ``model`` on ``train_data``; :meth:`fit` runs the epochs and returns the summary.

    Args:
        model: any nn.Module. With ``config.fastops`` its stock modules are swapped for fastops ones
            (:func:`fastops.swap_modules`) and it is optimized with FusedAdamW.
        train_data, val_data, test_data: a map-style Dataset (the DataLoader is built here: a
            DistributedSampler seeded by ``config.seed``, pinned memory on CUDA, ``num_workers``),
            or a ready DataLoader (any sized iterable of batches) used as it is (under torchrun,
            give it a DistributedSampler; set_epoch is called on it each epoch). Batches are
            ``(inputs, targets, ...)``: the model is called on ``inputs``. val_data picks the best
            epoch and drives early stopping; test_data is evaluated once, with the best weights.
        loss_fn: ``loss_fn(outputs, batch)``, the mean loss of the batch; default cross-entropy
            against ``batch[1]``.
        metric_fn: ``metric_fn(outputs, batch)``, the metric summed over the batch's samples (higher
            is better); default the number of correct argmax predictions (accuracy).
        config: the TrainConfig (default TrainConfig()).
        blocks: the model's repeated blocks (submodule names, class names or classes, see
            :func:`fastops.train.activation_checkpointing.find_blocks`): what ``config.checkpointing``
            recomputes and what ``config.fsdp`` shards one by one. Default ``config.blocks``.
        batch_transform: applied to every training batch on the device (augmentation drawing from
            the global RNG, which a resumed run restores).
    """

    def __init__(
        self,
        model: nn.Module,
        train_data: TrainData,
        val_data: TrainData | None = None,
        *,
        test_data: TrainData | None = None,
        loss_fn: LossFn | None = None,
        metric_fn: MetricFn | None = None,
        config: TrainConfig | None = None,
        blocks: Sequence[BlockSpec] | None = None,
        batch_transform: Callable[[Batch], Batch] | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"fastops.train: model must be an nn.Module, got {type(model).__name__}")
        self.cfg = (config or TrainConfig()).validate()
        self.loss_fn = loss_fn or cross_entropy_loss
        self.metric_fn = metric_fn or accuracy_sum
        self.batch_transform = batch_transform
        self._join_processes()
        self._find_extras()
        self._make_loaders(train_data, val_data, test_data)
        self._prepare_model(model, self.cfg.blocks if blocks is None else blocks)
        self._make_optimization()
        self._start_progress()
        if self.cfg.resume is not None:
            self.load(self.cfg.resume)

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> Trainer:
        """The job the CLI runs: cfg.model (default the bundled ConvNet of fastops blocks) on
        cfg.dataset (digits, synthetic or an ImageFolder directory)."""
        cfg.validate()
        info = distributed.setup(cfg.resolved_device())
        data = build_data(cfg, rank=info.rank, world_size=info.world_size, device=info.device)
        # Same seed on every rank for the initial weights (DDP would broadcast rank 0's anyway).
        model = model_from_config(cfg, in_channels=data.in_channels, num_classes=data.num_classes)
        augment = None
        if cfg.augment and cfg.dataset == "digits":
            shift = cfg.image_size / 8  # up to one original pixel

            def augment(batch: Batch) -> Batch:
                return (random_translate(batch[0], shift), *batch[1:])

        blocks: Sequence[BlockSpec] = cfg.blocks
        if not blocks and cfg.model == "convnet":
            blocks = [SeparableBlock]
        return cls(
            model,
            data.train,
            data.val,
            test_data=data.test,
            config=cfg,
            blocks=blocks,
            batch_transform=augment,
        )

    # ---------------------------------------------------------------- setting up, step by step
    def _join_processes(self) -> None:
        """Threads, the process group (under torchrun), the device and the run directory."""
        cfg = self.cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.dist = distributed.setup(cfg.resolved_device())
        self.device = self.dist.device
        self.is_main = self.dist.is_main
        if cfg.fsdp and not self.dist.enabled:
            raise ConfigError(
                "fastops.train: --fsdp shards over the processes of torchrun "
                "(torchrun --nproc_per_node=N ... --fsdp); this is a single process"
            )
        self.run_dir = Path(cfg.out_dir)
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.device.type == "cuda":
            # Fixed input shapes: let cuDNN time its algorithms once and keep the fastest.
            torch.backends.cudnn.benchmark = True
            torch.cuda.reset_peak_memory_stats(self.device)  # peak_memory_mb is this run's

    def _find_extras(self) -> None:
        """Which optional records this run can write; each one missing is named once, up front."""
        notify = self.is_main
        self.draw_plots = extras.optional("matplotlib", "no curves.png is drawn", "matplotlib", notify=notify)
        self.tensorboard = extras.optional(
            "tensorboard", "no TensorBoard events are written", "tensorboard", notify=notify
        )
        self.progress_bar = self.cfg.progress and extras.optional(
            "tqdm", "there is no progress bar", "tqdm", notify=notify and self.cfg.progress
        )

    def _loader(self, data: TrainData, name: str, *, train: bool) -> Iterable[Batch]:
        expected = (
            f"fastops.train: {name} must be a map-style torch.utils.data.Dataset or a DataLoader "
            "(a sized iterable of batches)"
        )
        if isinstance(data, IterableDataset):
            # The sampler (shuffling, sharding over ranks) and the schedule (steps per epoch) need
            # len() and indexing, which a stream has not.
            raise TypeError(
                f"{expected}, got an IterableDataset ({type(data).__name__}): give a DataLoader over "
                "it whose len() is its number of batches, or a map-style Dataset"
            )
        if isinstance(data, Dataset):
            make = train_loader if train else eval_loader
            loader: Iterable[Batch] = make(
                data, self.cfg, rank=self.dist.rank, world_size=self.dist.world_size, device=self.device
            )
        elif isinstance(data, Iterable) and isinstance(data, Sized):
            loader = data
        else:
            raise TypeError(f"{expected}, got {type(data).__name__}")
        try:
            # A Dataset's own length, the same on every rank (one rank's shard may be empty).
            size = len(data if isinstance(data, Dataset) else loader)  # type: ignore[arg-type]
        except TypeError:  # a DataLoader over an IterableDataset without __len__
            raise TypeError(
                f"{expected}; len() of this {type(data).__name__} fails: it has no length"
            ) from None
        if size == 0 and not train:
            # Scored as loss 0 and accuracy 0, it would stop the run early and keep epoch 1's weights.
            raise ConfigError(
                f"fastops.train: {name} is empty: give it samples, or leave it out (None) to score "
                "epochs on the training data"
            )
        return loader

    def _make_loaders(
        self, train_data: TrainData, val_data: TrainData | None, test_data: TrainData | None
    ) -> None:
        cfg = self.cfg
        self.train_loader = self._loader(train_data, "train_data", train=True)
        self.val_loader = None if val_data is None else self._loader(val_data, "val_data", train=False)
        self.test_loader = None if test_data is None else self._loader(test_data, "test_data", train=False)
        self.steps_per_epoch = len(self.train_loader) // cfg.accum_steps  # type: ignore[arg-type]
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"fastops.train: --batch-size {cfg.batch_size} x --accum-steps {cfg.accum_steps} x "
                f"{self.dist.world_size} process(es) is larger than the training set"
            )
        total_steps = cfg.epochs * self.steps_per_epoch
        if total_steps < 4:
            raise ConfigError(
                f"fastops.train: the run has {total_steps} optimizer step(s); the OneCycle schedule "
                "needs at least 4 (more --epochs, or a smaller --batch-size / --accum-steps)"
            )

    def _prepare_model(self, module: nn.Module, blocks: Sequence[BlockSpec]) -> None:
        """Swap in fastops modules, checkpoint the blocks, move to the device, then DDP or FSDP2,
        then compile. self.module is the model without the DDP/compile wrappers (evaluation,
        checkpoints); self.model is what the training step calls."""
        cfg = self.cfg
        self.swap_report = swap_modules(module) if cfg.fastops else None
        if cfg.checkpointing and not blocks:
            raise ConfigError(
                "fastops.train: --checkpointing needs the model's blocks to recompute: "
                "fit(..., blocks=[...]) or --blocks NAME ... (submodule or class names)"
            )
        try:
            self.blocks = find_blocks(module, blocks) if blocks else []
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if cfg.checkpointing:
            checkpoint_blocks(module, blocks)
        self.memory_format = torch.channels_last if cfg.use_channels_last() else torch.contiguous_format
        # Weights stay contiguous under FSDP2, which refuses to shard non-contiguous parameters
        # (the inputs may still be channels_last: convolutions take the mix).
        weights_format = torch.contiguous_format if cfg.fsdp else self.memory_format
        module = module.to(self.device, memory_format=weights_format)  # type: ignore[call-overload]
        if self.dist.enabled:
            # BN statistics over the global batch, so N ranks of batch B train like one of N*B.
            module = distributed.sync_batchnorm(module, self.device)
        model: nn.Module = module
        if cfg.fsdp:
            distributed.shard_fsdp2(module, [m for _, m in self.blocks], amp_dtype=amp.dtype(cfg.amp))
        elif self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if cfg.compile:
            # DDP first, then compile: TorchDynamo's DDPOptimizer splits the graph at DDP's bucket
            # boundaries so the all-reduces still overlap with backward (PyTorch's DDP notes).
            model = torch.compile(model)  # type: ignore[assignment]
        self.module = module
        self.model = model
        # Dropout and augmentation draw different numbers on each rank.
        torch.manual_seed(cfg.seed + self.dist.rank)

    def _make_optimization(self) -> None:
        """Optimizer, OneCycle schedule, GradScaler and autocast."""
        cfg = self.cfg
        self.optimizer = make_optimizer(self.module, cfg)
        total_steps = cfg.epochs * self.steps_per_epoch
        # Warm up over a quarter of the run, but over at least two steps (OneCycleLR divides by the
        # length of each phase).
        self.scheduler = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer,
            max_lr=cfg.lr,
            total_steps=total_steps,
            pct_start=min(0.5, max(0.25, 2.0 / total_steps)),
        )
        self.scaler = amp.make_scaler(cfg.amp, self.device)
        self.autocast = functools.partial(amp.autocast, cfg.amp, self.device)

    def _start_progress(self) -> None:
        """Counters, early stopping and the NaN flag of a run at its start (load() restores them)."""
        self.early = EarlyStopping(self.cfg.patience)
        self.epoch = 0  # epochs completed
        self.step = 0  # optimizer steps completed
        self.history: list[dict[str, Any]] = []
        self.best_state: dict[str, Tensor] | None = None
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=self.device)
        self.last_good: tuple[Path, int] | None = None  # the newest good checkpoint and its epoch

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        # Every rank's RNG state (dropout, augmentation); collective, so all ranks call it.
        rngs = distributed.all_gather_objects(checkpoint.rng_state(self.device), self.dist)
        if self.cfg.fsdp:
            # This rank's shards, keyed as in the plain model: torch.distributed.checkpoint's
            # state_dict API, which knows FSDP2's DTensors.
            from torch.distributed.checkpoint.state_dict import get_state_dict

            model_state, optimizer_state = get_state_dict(self.module, self.optimizer)
        else:
            model_state, optimizer_state = self.module.state_dict(), self.optimizer.state_dict()
        return {
            "format": checkpoint.FORMAT_VERSION,
            "model": model_state,
            "optimizer": optimizer_state,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "early_stopping": self.early.state_dict(),
            "epoch": self.epoch,
            "step": self.step,
            "rng": rngs,
            "history": self.history,
            "config": self.cfg.to_dict(),
        }

    def save(self, path: Path, state: dict[str, Any]) -> None:
        if self.cfg.fsdp:
            # Every rank writes its shards (torch.distributed.checkpoint) into a new directory;
            # then rank 0 atomically replaces ``path``, which names it, so a kill anywhere leaves
            # the previous pair intact.
            state = checkpoint.save_sharded(state, path, tag=self.step, is_main=self.is_main)
        elif self.is_main:  # one writer; the others wait at the barrier so nobody reads a half file
            checkpoint.atomic_save(state, path)
        distributed.barrier(self.dist)
        if path.name == "last.pt":
            self.last_good = (path, self.epoch)
        if self.cfg.fsdp and self.is_main:
            checkpoint.remove_stale_shards(path, keep=state["sharded"])

    def _save_best(self) -> None:
        """best.pt: the weights (only) of this epoch, the best so far, for evaluation."""
        self.best_state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        self.save(
            self.run_dir / "best.pt",
            {"format": checkpoint.FORMAT_VERSION, "model": self.best_state, "epoch": self.epoch},
        )

    def load(self, path: str | Path) -> None:
        ckpt = checkpoint.load(path, map_location=self.device, resumable=True)
        if ("sharded" in ckpt) != self.cfg.fsdp:
            raise ConfigError(
                f"fastops.train: --resume {str(path)!r} was written "
                f"{'with' if 'sharded' in ckpt else 'without'} --fsdp; resume it the same way"
            )
        if self.cfg.fsdp and len(ckpt["rng"]) != self.dist.world_size:
            raise ConfigError(
                f"fastops.train: --resume {str(path)!r} holds the shards of {len(ckpt['rng'])} "
                f"processes, this run has {self.dist.world_size}; resume on the same number"
            )
        self.last_good = (Path(path), ckpt["epoch"])
        saved = ckpt["config"]
        for key in RESUME_INVARIANTS:
            if saved.get(key) != getattr(self.cfg, key):
                raise ConfigError(
                    f"fastops.train: --resume {str(path)!r} was written with {key}={saved.get(key)!r}, "
                    f"this run has {key}={getattr(self.cfg, key)!r}; they must match"
                )
        if self.cfg.fsdp:
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            model_state, optimizer_state = get_state_dict(self.module, self.optimizer)
            loaded = checkpoint.load_sharded(path, ckpt, {"model": model_state, "optimizer": optimizer_state})
            set_state_dict(
                self.module,
                self.optimizer,
                model_state_dict=loaded["model"],
                optim_state_dict=loaded["optimizer"],
            )
        else:
            self.module.load_state_dict(ckpt["model"])
            self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        self.early.load_state_dict(ckpt["early_stopping"])
        self.epoch, self.step, self.history = ckpt["epoch"], ckpt["step"], list(ckpt["history"])
        rngs = ckpt["rng"]
        if len(rngs) == self.dist.world_size:
            checkpoint.set_rng_state(rngs[self.dist.rank], self.device)
        elif self.is_main:
            print(
                f"fastops.train: checkpoint has RNG states of {len(rngs)} rank(s), this run has "
                f"{self.dist.world_size}: dropout/augmentation continue from fresh seeds"
            )
        best = Path(path).parent / "best.pt"
        if self.early.best_epoch == self.epoch:
            # The checkpoint's own epoch is the best one, so these are the best weights. best.pt is
            # written after last.pt: a kill between the two left it an epoch behind. Write it again.
            self._save_best()
        elif best.is_file():
            advice = (
                f"best.pt beside --resume {str(path)!r} holds the best epoch's weights, which the "
                "held-out test at the end of the run uses; restore it, or move it away to resume "
                "without it (best.pt then starts again from the next epoch that beats the best "
                "validation accuracy so far)"
            )
            try:
                saved_best = checkpoint.load(best, map_location=self.device)
            except checkpoint.CheckpointError as e:
                raise checkpoint.CheckpointError(f"{e}; {advice}") from e
            if saved_best["epoch"] != self.early.best_epoch:
                raise checkpoint.CheckpointError(
                    f"fastops.train: {str(best)!r} holds epoch {saved_best['epoch']}, but the best "
                    f"epoch of --resume {str(path)!r} is {self.early.best_epoch}; {advice}"
                )
            if "sharded" in saved_best:
                # Into copies: the live weights are the resumed epoch's, not the best one's.
                copies = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
                self.best_state = checkpoint.load_sharded(best, saved_best, {"model": copies})["model"]
            else:
                self.best_state = saved_best["model"]

    # ---------------------------------------------------------------- the epochs
    def _to_device(self, batch: Batch) -> Batch:
        """The batch's tensors on the device; images (4-D floating tensors) in the model's memory format."""
        model_inputs(batch)  # a clear error for a batch that is not (inputs, targets, ...)

        def move(t: Any) -> Any:
            if not isinstance(t, Tensor):
                return t
            # non_blocking: with pinned host memory the copy is asynchronous to the host.
            if t.dim() == 4 and t.is_floating_point():
                return t.to(self.device, non_blocking=True, memory_format=self.memory_format)
            return t.to(self.device, non_blocking=True)

        return type(batch)(move(t) for t in batch) if isinstance(batch, tuple) else [move(t) for t in batch]

    def _batches(self, loader: Iterable[Batch]) -> Iterator[list[Batch]]:
        """Micro-batch groups of one optimizer step, on the device, augmented."""
        it = iter(loader)
        for _ in range(self.steps_per_epoch):
            group = []
            for _ in range(self.cfg.accum_steps):
                batch = self._to_device(next(it))
                if self.batch_transform is not None:
                    batch = self.batch_transform(batch)
                group.append(batch)
            yield group

    def _kept(self) -> str:
        if self.last_good is None:
            return "no checkpoint had been written yet"
        path, epoch = self.last_good
        return f"the last good checkpoint ({path}, epoch {epoch}) is kept"

    def _check_nonfinite(self) -> None:
        """The one host sync of the loss flag, at log intervals and epoch ends, not every step."""
        flag = self.nonfinite.to(torch.int32)
        distributed.all_reduce_sum(flag, self.dist)  # every rank stops together
        if int(flag) and self.cfg.nonfinite == "stop":
            raise NonFiniteLossError(
                f"fastops.train: the training loss became NaN/inf before step {self.step} "
                f"(epoch {self.epoch + 1}); the run is stopped and {self._kept()}"
            )

    def _state_is_finite(self) -> bool:
        """Whether the weights, buffers and optimizer state are free of NaN/inf on every rank.

        A NaN gradient with a finite loss (say in the last step of an epoch) makes the weights NaN
        without the loss flag ever seeing it. This catches it before a checkpoint is written, at the
        cost of one host sync per epoch, never one per step.
        """
        tensors = checkpoint.training_state_tensors(self.module.state_dict(), self.optimizer.state)
        bad = (~checkpoint.all_finite(tensors, self.device)).to(torch.int32)
        distributed.all_reduce_sum(bad, self.dist)  # every rank stops together
        return not int(bad)

    def train_epoch(self) -> dict[str, float]:
        cfg = self.cfg
        self.model.train()
        loader = self.train_loader
        # The DistributedSampler's shuffle is seeded by seed + epoch: a new order each epoch that
        # is the same on every rank and in a resumed run.
        for owner in (getattr(loader, "sampler", None), loader):
            if hasattr(owner, "set_epoch"):
                owner.set_epoch(self.epoch)  # type: ignore[union-attr]
                break
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, metric, samples
        bar = _progress(
            self.steps_per_epoch, f"epoch {self.epoch + 1}/{cfg.epochs}", self.is_main and self.progress_bar
        )
        profiler = self._profiler() if cfg.profile and self.epoch == 0 else contextlib.nullcontext()
        start = time.perf_counter()
        with profiler as prof:
            for i, group in enumerate(self._batches(loader)):
                result = train_step(
                    self.model,
                    group,
                    optimizer=self.optimizer,
                    scaler=self.scaler,
                    autocast=self.autocast,
                    loss_fn=self.loss_fn,
                    metric_fn=self.metric_fn,
                    grad_clip=cfg.grad_clip,
                )
                # OneCycleLR is defined per optimizer step, so it steps after every optimizer step.
                self.scheduler.step()
                self.step += 1
                self.nonfinite |= ~torch.isfinite(result.loss)
                sums[0] += result.loss
                sums[1] += result.metric
                sums[2] += sum(batch_size_of(b) for b in group)
                if prof is not None:
                    prof.step()
                if (i + 1) % cfg.log_every == 0 or i + 1 == self.steps_per_epoch:
                    self._check_nonfinite()
                    if bar is not None:
                        bar.set_postfix(
                            loss=f"{result.loss.item():.4f}", lr=f"{self.scheduler.get_last_lr()[0]:.2e}"
                        )
                if bar is not None:
                    bar.update()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        if bar is not None:
            bar.close()
        distributed.all_reduce_sum(sums, self.dist)
        loss, correct, samples = sums.tolist()
        return {
            "train_loss": loss / self.steps_per_epoch / self.dist.world_size,
            "train_accuracy": correct / samples,
            "epoch_time_s": elapsed,
            "samples_per_s": samples / elapsed,
        }

    @torch.no_grad()
    def evaluate(self, loader: Iterable[Batch]) -> dict[str, float]:
        """Loss and metric over this rank's shard, summed over ranks. Runs the unwrapped module:
        DDP's forward would broadcast buffers, a collective that ranks with unequal shards would
        call a different number of times. An FSDP2 module all-gathers its parameters in every
        forward, so there each rank runs as many forwards as the rank with the most batches."""
        self.module.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, metric, samples
        batches: Iterable[Batch] = loader
        if self.cfg.fsdp:
            batches = distributed.padded_batches(loader, self.dist)
        for raw, weight in _weighted(batches):
            batch = self._to_device(raw)
            with self.autocast():
                outputs = self.module(model_inputs(batch))
            n = batch_size_of(batch)
            sums[0] += weight * self.loss_fn(outputs, batch).double() * n
            sums[1] += weight * self.metric_fn(outputs, batch)
            sums[2] += weight * n
        distributed.all_reduce_sum(sums, self.dist)
        loss, metric, samples = sums.tolist()
        return {"loss": loss / max(samples, 1), "accuracy": metric / max(samples, 1)}

    def _profiler(self) -> Any:
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        run_dir = self.run_dir

        def on_ready(prof: Any) -> None:
            if self.is_main:
                prof.export_chrome_trace(str(run_dir / "trace.json"))
                sort = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
                (run_dir / "profile.txt").write_text(prof.key_averages().table(sort_by=sort, row_limit=40))

        return profile(
            activities=activities,
            schedule=schedule(wait=1, warmup=2, active=5, repeat=1),
            on_trace_ready=on_ready,
            record_shapes=True,
        )

    def fit(self) -> dict[str, Any]:
        """Train from self.epoch to cfg.epochs (or early stop / --stop-after-epoch); return the summary."""
        cfg = self.cfg
        metrics = (
            MetricsWriter(self.run_dir, self.history, step=self.step, tensorboard=self.tensorboard)
            if self.is_main
            else None
        )
        started_at = self.epoch
        stopped = "completed"
        wall = time.perf_counter()
        try:
            while self.epoch < cfg.epochs:
                if self.early.should_stop:
                    stopped = "early_stopping"
                    break
                if cfg.stop_after_epoch is not None and self.epoch >= cfg.stop_after_epoch:
                    stopped = "stop_after_epoch"
                    break
                train = self.train_epoch()
                # Without validation data the training numbers stand in: the newest weights are
                # then the best unless the training metric fell.
                val = (
                    self.evaluate(self.val_loader)
                    if self.val_loader is not None
                    else {"loss": train["train_loss"], "accuracy": train["train_accuracy"]}
                )
                self.epoch += 1
                row = {
                    "epoch": self.epoch,
                    "step": self.step,
                    "lr": self.scheduler.get_last_lr()[0],
                    **train,
                    "val_loss": val["loss"] if self.val_loader is not None else None,
                    "val_accuracy": val["accuracy"] if self.val_loader is not None else None,
                }
                self.history.append(row)
                if metrics is not None:
                    metrics.write(row)
                    held_out = (
                        f"val loss {val['loss']:.4f}  val acc {100 * val['accuracy']:6.2f}%  "
                        if self.val_loader is not None
                        else f"train acc {100 * train['train_accuracy']:6.2f}%  "
                    )
                    print(
                        f"epoch {self.epoch:3d}  loss {row['train_loss']:.4f}  {held_out}"
                        f"{train['samples_per_s']:8.1f} samples/s"
                    )
                # No checkpoint from non-finite weights or optimizer state. Nothing can skip them:
                # the step that made them has been taken, and every later one would start from them.
                if not self._state_is_finite():
                    raise NonFiniteLossError(
                        f"fastops.train: the weights or optimizer state became NaN/inf in epoch "
                        f"{self.epoch}; they are not saved, the run is stopped and {self._kept()}"
                    )
                # A NaN/inf validation loss from finite weights (an fp16 overflow, say) counts as a
                # non-finite training loss: stop, or with --nonfinite skip, skip this epoch's
                # checkpoints and count it as an epoch without improvement.
                if not math.isfinite(val["loss"]):
                    problem = f"fastops.train: the validation loss is {val['loss']} after epoch {self.epoch}"
                    if cfg.nonfinite == "stop":
                        raise NonFiniteLossError(f"{problem}; the run is stopped and {self._kept()}")
                    if self.is_main:
                        print(f"{problem}; no checkpoint of this epoch (--nonfinite skip)")
                    self.early.update(-math.inf, self.epoch)
                    continue
                improved = self.early.update(val["accuracy"], self.epoch)
                self.save(self.run_dir / "last.pt", self.state_dict())
                # best.pt after last.pt: a kill between them leaves a last.pt whose best epoch is its
                # own, from which load() writes best.pt again. The other order would leave a best.pt
                # of an epoch the resumed run has not reached, with the best before it overwritten.
                if improved:
                    self._save_best()
            else:
                stopped = "early_stopping" if self.early.should_stop else "completed"
        except NonFiniteLossError:
            stopped = "nonfinite_loss"
            raise
        finally:
            if metrics is not None:
                metrics.close()
            summary = self._summary(stopped, started_at, time.perf_counter() - wall)
        return summary

    def _summary(self, stopped: str, started_at: int, wall_s: float) -> dict[str, Any]:
        cfg = self.cfg
        test = None
        if (
            stopped in ("completed", "early_stopping")
            and self.test_loader is not None
            and self.best_state is not None
        ):
            self.module.load_state_dict(self.best_state)  # the held-out number is the best epoch's
            test = self.evaluate(self.test_loader)["accuracy"]
        # Throughput without the first epoch of this invocation (warm-up, torch.compile) when possible.
        timed = self.history[started_at:]
        timed = timed[1:] if len(timed) > 1 else timed
        samples = sum(h["samples_per_s"] * h["epoch_time_s"] for h in timed)
        seconds = sum(h["epoch_time_s"] for h in timed)
        summary = {
            "val_accuracy": self.early.best if self.history and self.val_loader is not None else None,
            "best_epoch": self.early.best_epoch,
            "final_val_accuracy": self.history[-1]["val_accuracy"] if self.history else None,
            "test_accuracy": test,
            "train_loss": self.history[-1]["train_loss"] if self.history else None,
            "samples_per_s": samples / seconds if seconds else None,
            "peak_memory_mb": peak_memory_mb(self.device),
            "epochs": self.epoch,
            "steps": self.step,
            "stopped": stopped,
            "wall_time_s": wall_s,
            "device": str(self.device),
            "world_size": self.dist.world_size,
            "amp": cfg.amp,
            "fastops": cfg.fastops,
            "swapped": self.swap_report.counts() if self.swap_report is not None else {},
            "config": cfg.to_dict(),
        }
        if self.is_main:
            write_json(self.run_dir / "summary.json", summary)
            if self.history and self.draw_plots:
                from fastops.train.plots import plot_curves

                plot_curves(self.history, self.run_dir / "curves.png", "fastops" if cfg.fastops else "stock")
        return summary


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)


def _weighted(batches: Iterable[Any]) -> Iterator[tuple[Batch, float]]:
    """(batch, weight) pairs; a plain loader's batches all weigh 1."""
    for item in batches:
        yield item if isinstance(item, distributed.Weighted) else (item, 1.0)


def _configured(config: TrainConfig | None, overrides: dict[str, Any]) -> TrainConfig:
    cfg = (config or TrainConfig()).replace(**overrides)
    if "out_dir" in overrides:
        cfg.out_dir = Path(cfg.out_dir)
    return cfg


def fit(
    model: nn.Module,
    train_data: TrainData,
    val_data: TrainData | None = None,
    *,
    test_data: TrainData | None = None,
    loss_fn: LossFn | None = None,
    metric_fn: MetricFn | None = None,
    config: TrainConfig | None = None,
    blocks: Sequence[BlockSpec] | None = None,
    batch_transform: Callable[[Batch], Batch] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Train your ``model`` on your data; returns the summary (also written to summary.json).

    Arguments as for :class:`Trainer`; ``overrides`` update ``config`` (default TrainConfig()).
    Example::

        model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
        fit(model, TensorDataset(x, y), TensorDataset(xv, yv), epochs=5, amp="bf16", out_dir="runs/mlp")
    """
    cfg = _configured(config, overrides)
    trainer = Trainer(
        model,
        train_data,
        val_data,
        test_data=test_data,
        loss_fn=loss_fn,
        metric_fn=metric_fn,
        config=cfg,
        blocks=blocks,
        batch_transform=batch_transform,
    )
    return trainer.fit()


def run(config: TrainConfig | None = None, **overrides: Any) -> dict[str, Any]:
    """The bundled job (what the CLI runs): ``config`` (default TrainConfig()) updated by
    ``overrides``; returns the summary. Example: ``run(epochs=5, amp="bf16", out_dir="runs/x")``."""
    return Trainer.from_config(_configured(config, overrides)).fit()
