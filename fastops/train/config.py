"""TrainConfig: every knob of a run, validated in one place so bad settings fail before any work."""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

AMP_CHOICES = ("none", "bf16", "fp16")
DATASET_CHOICES = ("digits", "synthetic")
DEVICE_CHOICES = ("auto", "cpu", "cuda")
NONFINITE_CHOICES = ("stop", "skip")


class ConfigError(ValueError):
    """A setting that cannot work; the message names the option and what was expected."""


INT64_MAX = 2**63 - 1  # what torch's C++ side takes; a larger int fails there with "Overflow"


@dataclass(frozen=True)
class Number:
    """The values a numeric setting accepts: an integer, or a finite float, within bounds.

    Declared once, with the setting (``number(...)`` in TrainConfig); TrainConfig.validate checks
    the field with it, and the CLI parses the option with it, so both say the same thing.
    """

    kind: type  # int or float
    low: float
    low_open: bool = False  # low itself excluded: "> low"
    high: float | None = None
    high_open: bool = False
    optional: bool = False  # None is allowed too

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        if self.high is None:
            return f"{what} {'>' if self.low_open else '>='} {self.low}"
        return f"{what} in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"

    def problem(self, value: object) -> str | None:
        """What was expected, if ``value`` is not allowed; else None."""
        if value is None and self.optional:
            return None
        kind = numbers.Integral if self.kind is int else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind):
            return self.describe()
        v = cast(float, value)
        if self.kind is float:
            try:
                v = float(v)  # an int too large for a float raises OverflowError
            except OverflowError:
                return self.describe()
            if not math.isfinite(v):
                return self.describe()
        if v < self.low or (self.low_open and v == self.low):
            return self.describe()
        if self.high is not None and (v > self.high or (self.high_open and v == self.high)):
            return self.describe()
        if self.kind is int and v > INT64_MAX:
            return f"{self.describe()} and at most 2**63 - 1"
        return None

    def parse(self, text: str) -> int | float:
        """``text`` as a value of this setting; ValueError("expected ..., got ...") if it is not one."""
        try:
            value = self.kind(text)
        except ValueError:
            raise ValueError(f"expected {self.describe()}, got {text!r}") from None
        expected = self.problem(value)
        if expected is not None:
            raise ValueError(f"expected {expected}, got {text}")
        return value


def number(default: float | None, kind: type | None = None, **bounds: Any) -> Any:
    """A numeric TrainConfig field: its default and its Number (``kind`` is the default's type
    unless given; ``bounds`` as in Number)."""
    return field(default=default, metadata={"number": Number(kind or type(default), **bounds)})


@dataclass
class TrainConfig:
    # what to train
    model: str = "convnet"  # the CLI's model (see fastops.train.model.load_model)
    blocks: tuple[str, ...] = ()  # the model's blocks: units of --checkpointing and --fsdp
    pretrained: bool = False
    dataset: str = "digits"  # "digits" (sklearn, real data) or "synthetic" (random images, throughput)
    # digits are 8x8 and upsampled to this; synthetic images are this size
    image_size: int = number(16, low=8)
    num_classes: int = number(10, low=2)  # synthetic only; digits has 10
    synthetic_samples: int = number(4096, low=1)  # synthetic: samples per epoch (per rank)
    width: int = number(32, low=1)  # channels of the first stage; later stages double it
    dropout: float = number(0.1, low=0, high=1, high_open=True)
    augment: bool = True  # random translations of the training digits
    fastops: bool = True  # False: the same model with stock modules and torch.optim.AdamW
    # how to train
    epochs: int = number(30, low=1)
    batch_size: int = number(64, low=1)  # per process, per micro-batch
    accum_steps: int = number(1, low=1)  # micro-batches per optimizer step
    lr: float = number(4e-3, low=0, low_open=True)  # OneCycleLR peak
    weight_decay: float = number(0.05, low=0)
    grad_clip: float = number(1.0, low=0)  # max global grad norm; 0 disables
    patience: int = number(8, low=0)  # early stopping: epochs without a better val accuracy; 0 disables
    # Bounded so that every seed derived from it (+ rank, + epoch, * 1000 for synthetic data)
    # stays within what torch.manual_seed takes.
    seed: int = number(0, low=0, high=2**32 - 1)
    # how to run it
    device: str = "auto"
    amp: str = "none"
    checkpointing: bool = False  # activation checkpointing of the model's blocks
    # None: on. NHWC is what cuDNN's fast kernels want, and on the CPU it is where fastops' depthwise
    # kernels and oneDNN do best (digits model, 2 threads: 25.9 ms/step NHWC vs 33.0 ms NCHW with
    # fastops; stock 29.8 vs 30.2 ms).
    channels_last: bool | None = None
    compile: bool = False
    fsdp: bool = False  # under torchrun: shard with FSDP2 instead of DDP
    num_workers: int = number(0, low=0)
    # CPU intra-op threads (torch.set_num_threads, a C int); 0 keeps torch's default
    threads: int = number(0, low=0, high=2**31 - 1)
    nonfinite: str = "stop"  # what a NaN/inf (training or validation) loss does: stop, or skip steps (fp16)
    # steps between progress-bar/NaN checks (the only host syncs of a step)
    log_every: int = number(20, low=1)
    profile: bool = False  # write a torch.profiler trace of a few steps into the run dir
    # where results go
    out_dir: Path = field(default_factory=lambda: Path("runs/train"))
    resume: Path | None = None
    # stop this invocation after that epoch (split a run in jobs)
    stop_after_epoch: int | None = number(None, int, low=1, optional=True)
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
        for name, spec in NUMBERS.items():
            value = getattr(self, name)
            expected = spec.problem(value)
            need(expected is None, f"--{name.replace('_', '-')} must be {expected}, got {value!r}")
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


# The numeric settings and their domains, by field name.
NUMBERS: dict[str, Number] = {
    f.name: f.metadata["number"] for f in dataclasses.fields(TrainConfig) if "number" in f.metadata
}
