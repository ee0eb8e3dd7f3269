"""TrainConfig: every knob of a run, validated in one place so bad settings fail before any work."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

AMP_CHOICES = ("none", "bf16", "fp16")
DATASET_CHOICES = ("digits", "synthetic")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
NONFINITE_CHOICES = ("stop", "skip")


class ConfigError(ValueError):
    """A setting that cannot work; the message names the option and what was expected."""


@dataclass
class TrainConfig:
    # what to train
    dataset: str = "digits"  # "digits" (sklearn, real data) or "synthetic" (random images, throughput)
    image_size: int = 16  # digits are 8x8 and upsampled to this; synthetic images are this size
    num_classes: int = 10  # synthetic only; digits has 10
    synthetic_samples: int = 4096  # synthetic: samples per epoch (per rank)
    width: int = 32  # channels of the first stage; later stages double it
    dropout: float = 0.1
    augment: bool = True  # random translations of the training digits
    fastops: bool = True  # False: the same model with stock modules and torch.optim.AdamW
    # how to train
    epochs: int = 30
    batch_size: int = 64  # per process, per micro-batch
    accum_steps: int = 1  # micro-batches per optimizer step
    lr: float = 4e-3  # OneCycleLR peak
    weight_decay: float = 0.05
    grad_clip: float = 1.0  # max global grad norm; 0 disables
    patience: int = 8  # early stopping: epochs without a better val accuracy; 0 disables
    seed: int = 0
    # how to run it
    device: str = "auto"
    amp: str = "none"
    checkpointing: bool = False  # activation checkpointing of the model's blocks
    # None: on. NHWC is what cuDNN's fast kernels want, and on the CPU it is where fastops' depthwise
    # kernels and oneDNN do best (digits model, 2 threads: 25.9 ms/step NHWC vs 33.0 ms NCHW with
    # fastops; stock 29.8 vs 30.2 ms).
    channels_last: bool | None = None
    compile: bool = False
    num_workers: int = 0
    threads: int = 0  # CPU intra-op threads (torch.set_num_threads); 0 keeps torch's default
    nonfinite: str = "stop"  # what a NaN/inf loss does: stop the run, or skip steps (fp16 scaler)
    log_every: int = 20  # steps between progress-bar/NaN checks (the only host syncs of a step)
    profile: bool = False  # write a torch.profiler trace of a few steps into the run dir
    # where results go
    out_dir: Path = field(default_factory=lambda: Path("runs/train"))
    resume: Path | None = None
    stop_after_epoch: int | None = None  # stop this invocation after that epoch (split a run in jobs)
    progress: bool = True  # tqdm bar on rank 0

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def validate(self) -> TrainConfig:
        """Raise ConfigError for any setting that cannot work; return self."""

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(f"fastops.train: {msg}")

        for name, choices in (
            ("dataset", DATASET_CHOICES),
            ("device", DEVICE_CHOICES),
            ("amp", AMP_CHOICES),
            ("nonfinite", NONFINITE_CHOICES),
        ):
            value = getattr(self, name)
            need(value in choices, f"--{name.replace('_', '-')} must be one of {choices}, got {value!r}")
        for name in ("epochs", "batch_size", "accum_steps", "image_size", "width", "log_every"):
            value = getattr(self, name)
            need(
                isinstance(value, int) and value >= 1,
                f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}",
            )
        need(self.image_size >= 8, f"--image-size must be >= 8, got {self.image_size}")
        need(self.num_classes >= 2, f"--num-classes must be >= 2, got {self.num_classes}")
        need(self.synthetic_samples >= 1, "--synthetic-samples must be >= 1")
        need(0.0 <= self.dropout < 1.0, f"--dropout must be in [0, 1), got {self.dropout}")
        need(self.lr > 0, f"--lr must be > 0, got {self.lr}")
        need(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        need(self.grad_clip >= 0, f"--grad-clip must be >= 0 (0 disables), got {self.grad_clip}")
        need(self.patience >= 0, f"--patience must be >= 0 (0 disables), got {self.patience}")
        need(self.num_workers >= 0, f"--num-workers must be >= 0, got {self.num_workers}")
        need(self.threads >= 0, f"--threads must be >= 0 (0: torch's default), got {self.threads}")
        need(
            self.stop_after_epoch is None or self.stop_after_epoch >= 1,
            f"--stop-after-epoch must be >= 1, got {self.stop_after_epoch}",
        )
        if self.device == "cuda":
            need(torch.cuda.is_available(), "--device cuda was asked for but CUDA is not available")
        device = self.resolved_device()
        if self.amp == "fp16":
            need(
                device.type == "cuda",
                "--amp fp16 needs a CUDA device (fp16 autocast with a GradScaler); on the CPU use --amp bf16",
            )
        if self.nonfinite == "skip":
            need(
                self.amp == "fp16",
                "--nonfinite skip needs --amp fp16 (the GradScaler skips steps with inf/NaN "
                "gradients without a host sync); otherwise use --nonfinite stop",
            )
        if self.resume is not None:
            need(Path(self.resume).is_file(), f"--resume: no checkpoint file at {str(self.resume)!r}")
        if self.compile:
            need(hasattr(torch, "compile"), "--compile needs torch.compile")
        return self

    def use_channels_last(self) -> bool:
        return True if self.channels_last is None else self.channels_last

    def replace(self, **changes: object) -> TrainConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, object]:
        """JSON-able copy (paths as strings), for summary.json and checkpoints."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = os.fspath(v) if isinstance(v, Path) else v
        return out
