"""Trainer: builds data, model, optimizer, schedule and scaler from a TrainConfig and runs the epochs.

Use it as a library (``fastops.train.fit(TrainConfig(...))`` or ``Trainer(cfg).fit()``) or through
the CLI (``python -m fastops.train``, ``torchrun ... -m fastops.train``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fastops.train import amp, checkpoint, distributed
from fastops.train.config import ConfigError, TrainConfig
from fastops.train.data import build_data, random_translate
from fastops.train.loop import train_step
from fastops.train.metrics import EarlyStopping, MetricsWriter, peak_memory_mb, write_json
from fastops.train.model import build_model

# Settings a resumed run must share with the run that wrote the checkpoint: they fix the model's
# shape, the data order and the length of the learning-rate schedule.
RESUME_INVARIANTS = ("dataset", "image_size", "num_classes", "width", "epochs", "batch_size", "accum_steps")


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
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg.validate()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.dist = distributed.setup(cfg.resolved_device())
        self.device = self.dist.device
        self.is_main = self.dist.is_main
        self.run_dir = Path(cfg.out_dir)
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.device.type == "cuda":
            # Fixed input shapes: let cuDNN time its algorithms once and keep the fastest.
            torch.backends.cudnn.benchmark = True
            torch.cuda.reset_peak_memory_stats(self.device)  # peak_memory_mb is this run's

        self.data = build_data(cfg, rank=self.dist.rank, world_size=self.dist.world_size, device=self.device)
        self.steps_per_epoch = len(self.data.train) // cfg.accum_steps
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"fastops.train: --batch-size {cfg.batch_size} x --accum-steps {cfg.accum_steps} x "
                f"{self.dist.world_size} process(es) is larger than the training set"
            )

        # Same seed on every rank for the initial weights (DDP would broadcast rank 0's anyway).
        torch.manual_seed(cfg.seed)
        module: nn.Module
        module, self.swap_report = build_model(
            in_channels=self.data.in_channels,
            num_classes=self.data.num_classes,
            image_size=cfg.image_size,
            width=cfg.width,
            dropout=cfg.dropout,
            fastops=cfg.fastops,
        )
        module.activation_checkpointing = cfg.checkpointing
        self.memory_format = torch.channels_last if cfg.use_channels_last() else torch.contiguous_format
        module = module.to(self.device, memory_format=self.memory_format)  # type: ignore[call-overload]
        if self.dist.enabled:
            # BN statistics over the global batch, so N ranks of batch B train like one of N*B.
            module = distributed.sync_batchnorm(module, self.device)
        self.module = module  # unwrapped: evaluation, checkpoints
        model: nn.Module = module
        if self.dist.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        if cfg.compile:
            # DDP first, then compile: TorchDynamo's DDPOptimizer splits the graph at DDP's bucket
            # boundaries so the all-reduces still overlap with backward (PyTorch's DDP notes).
            model = torch.compile(model)  # type: ignore[assignment]
        self.model = model
        # Dropout and augmentation draw different numbers on each rank.
        torch.manual_seed(cfg.seed + self.dist.rank)

        self.optimizer = make_optimizer(module, cfg)
        total_steps = cfg.epochs * self.steps_per_epoch
        if total_steps < 4:
            raise ConfigError(
                f"fastops.train: the run has {total_steps} optimizer step(s); the OneCycle schedule "
                "needs at least 4 (more --epochs, or a smaller --batch-size / --accum-steps)"
            )
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
        self.early = EarlyStopping(cfg.patience)
        self.epoch = 0  # epochs completed
        self.step = 0  # optimizer steps completed
        self.history: list[dict[str, Any]] = []
        self.best_state: dict[str, Tensor] | None = None
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=self.device)
        self.last_good: tuple[Path, int] | None = None  # the newest good checkpoint and its epoch
        if cfg.resume is not None:
            self.load(cfg.resume)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        # Every rank's RNG state (dropout, augmentation); collective, so all ranks call it.
        rngs = distributed.all_gather_objects(checkpoint.rng_state(self.device), self.dist)
        return {
            "format": checkpoint.FORMAT_VERSION,
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
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
        if self.is_main:  # one writer; the others wait at the barrier so nobody reads a half file
            checkpoint.atomic_save(state, path)
        distributed.barrier(self.dist)
        if path.name == "last.pt":
            self.last_good = (path, self.epoch)

    def _save_best(self) -> None:
        """best.pt: the weights (only) of this epoch, the best so far, for evaluation."""
        self.best_state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
        self.save(
            self.run_dir / "best.pt",
            {"format": checkpoint.FORMAT_VERSION, "model": self.best_state, "epoch": self.epoch},
        )

    def load(self, path: str | Path) -> None:
        ckpt = checkpoint.load(path, map_location=self.device, resumable=True)
        self.last_good = (Path(path), ckpt["epoch"])
        saved = ckpt["config"]
        for key in RESUME_INVARIANTS:
            if saved.get(key) != getattr(self.cfg, key):
                raise ConfigError(
                    f"fastops.train: --resume {str(path)!r} was written with {key}={saved.get(key)!r}, "
                    f"this run has {key}={getattr(self.cfg, key)!r}; they must match"
                )
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
            self.best_state = saved_best["model"]

    # ---------------------------------------------------------------- the epochs
    def _batches(self, loader) -> Any:
        """Micro-batch groups of one optimizer step, on the device, augmented."""
        it = iter(loader)
        for _ in range(self.steps_per_epoch):
            group = []
            for _ in range(self.cfg.accum_steps):
                x, y = next(it)
                # non_blocking: with pinned host memory the copy is asynchronous to the host.
                x = x.to(self.device, non_blocking=True, memory_format=self.memory_format)
                y = y.to(self.device, non_blocking=True)
                if self.cfg.augment and self.cfg.dataset == "digits":
                    x = random_translate(x, self.cfg.image_size / 8)  # up to one original pixel
                group.append((x, y))
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
        loader = self.data.train
        sampler = getattr(loader, "sampler", loader)
        # The DistributedSampler's shuffle is seeded by seed + epoch: a new order each epoch that
        # is the same on every rank and in a resumed run.
        sampler.set_epoch(self.epoch)  # type: ignore[union-attr]
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss, correct, samples
        bar = _progress(
            self.steps_per_epoch, f"epoch {self.epoch + 1}/{cfg.epochs}", self.is_main and cfg.progress
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
                    grad_clip=cfg.grad_clip,
                )
                # OneCycleLR is defined per optimizer step, so it steps after every optimizer step.
                self.scheduler.step()
                self.step += 1
                self.nonfinite |= ~torch.isfinite(result.loss)
                sums[0] += result.loss
                sums[1] += result.correct
                sums[2] += sum(len(y) for _, y in group)
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
    def evaluate(self, loader) -> dict[str, float]:
        """Loss and accuracy over this rank's shard, summed over ranks. Runs the unwrapped module:
        DDP's forward would broadcast buffers, a collective that ranks with unequal shards would
        call a different number of times."""
        self.module.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)
        for x, y in loader:
            x = x.to(self.device, non_blocking=True, memory_format=self.memory_format)
            y = y.to(self.device, non_blocking=True)
            with self.autocast():
                logits = self.module(x)
            sums[0] += nn.functional.cross_entropy(logits.float(), y, reduction="sum")
            sums[1] += (logits.argmax(1) == y).sum()
            sums[2] += len(y)
        distributed.all_reduce_sum(sums, self.dist)
        loss, correct, samples = sums.tolist()
        return {"loss": loss / max(samples, 1), "accuracy": correct / max(samples, 1)}

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
        metrics = MetricsWriter(self.run_dir, self.history, step=self.step) if self.is_main else None
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
                val = self.evaluate(self.data.val)
                self.epoch += 1
                row = {
                    "epoch": self.epoch,
                    "step": self.step,
                    "lr": self.scheduler.get_last_lr()[0],
                    **train,
                    "val_loss": val["loss"],
                    "val_accuracy": val["accuracy"],
                }
                self.history.append(row)
                if metrics is not None:
                    metrics.write(row)
                    print(
                        f"epoch {self.epoch:3d}  loss {row['train_loss']:.4f}  "
                        f"val loss {val['loss']:.4f}  val acc {100 * val['accuracy']:6.2f}%  "
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
            and self.data.test is not None
            and self.best_state is not None
        ):
            self.module.load_state_dict(self.best_state)  # the held-out number is the best epoch's
            test = self.evaluate(self.data.test)["accuracy"]
        # Throughput without the first epoch of this invocation (warm-up, torch.compile) when possible.
        timed = self.history[started_at:]
        timed = timed[1:] if len(timed) > 1 else timed
        samples = sum(h["samples_per_s"] * h["epoch_time_s"] for h in timed)
        seconds = sum(h["epoch_time_s"] for h in timed)
        summary = {
            "val_accuracy": self.early.best if self.history else None,
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
            if self.history:
                from fastops.train.plots import plot_curves

                plot_curves(self.history, self.run_dir / "curves.png", "fastops" if cfg.fastops else "stock")
        return summary


def _progress(total: int, desc: str, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, leave=False, dynamic_ncols=True)


def fit(cfg: TrainConfig | None = None, **overrides: Any) -> dict[str, Any]:
    """Train with ``cfg`` (default TrainConfig()) updated by ``overrides``; returns the summary dict.

    Example: ``fastops.train.fit(epochs=5, amp="bf16", out_dir="runs/x")``.
    """
    cfg = (cfg or TrainConfig()).replace(**overrides)
    if "out_dir" in overrides:
        cfg.out_dir = Path(cfg.out_dir)
    return Trainer(cfg).fit()
