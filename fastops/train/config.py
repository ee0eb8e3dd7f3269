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


def number(default: float | None, kind: type | None = None, *, help: str, **bounds: Any) -> Any:
    """A numeric TrainConfig field: its default, its Number (``kind`` is the default's type unless
    given; ``bounds`` as in Number) and its help text."""
    return field(default=default, metadata={"number": Number(kind or type(default), **bounds), "help": help})


def setting(
    default: Any = None, *, help: str, choices: tuple[str, ...] = (), flag: str = "", **kw: Any
) -> Any:
    """A TrainConfig field with its help text (and, for the CLI, its choices and a flag other than
    ``--field-name``): a setting is declared once, here, and the parser is generated from it."""
    metadata = {"help": help, "choices": choices, "flag": flag}
    if "default_factory" in kw:
        return field(default_factory=kw["default_factory"], metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TrainConfig:
    # what to train
    model: str = setting(
        "convnet",
        help="convnet (the bundled ConvNet of fastops blocks), timm:NAME, torchvision:NAME, or "
        "package.module:factory (your code; called with the keywords it takes among num_classes, "
        "in_channels, image_size)",
    )
    blocks: tuple[str, ...] = setting(
        (),
        help="the model's blocks, the units of --checkpointing and --fsdp: submodule names "
        "(layer1 layer2) or class names (Bottleneck); the convnet's are its SeparableBlocks",
    )
    pretrained: bool = setting(False, help="timm/torchvision weights, only if already downloaded")
    dataset: str = setting(
        "digits",
        flag="--data",
        help="digits (scikit-learn's, real data), synthetic (random images, throughput), or a "
        "directory in ImageFolder layout with train/ and val/ (and optionally test/) subfolders",
    )
    image_size: int = number(
        16, low=8, help="image side: digits are 8x8 upsampled to it (224 with --data synthetic)"
    )
    num_classes: int = number(10, low=2, help="synthetic data only; digits has 10")
    synthetic_samples: int = number(4096, low=1, help="synthetic data: samples per epoch and process")
    width: int = number(32, low=1, help="convnet: channels of the first stage; later stages double it")
    dropout: float = number(0.1, low=0, high=1, high_open=True, help="convnet: dropout before the head")
    augment: bool = setting(True, help="random translations of the digits; random crops and flips of images")
    fastops: bool = setting(
        True, help="fastops modules and FusedAdamW; --no-fastops: stock modules and AdamW"
    )
    # how to train
    epochs: int = number(30, low=1, help="training epochs (3 with --data synthetic)")
    batch_size: int = number(64, low=1, help="per process, per micro-batch")
    accum_steps: int = number(1, low=1, help="micro-batches per optimizer step")
    lr: float = number(4e-3, low=0, low_open=True, help="OneCycleLR peak learning rate")
    weight_decay: float = number(0.05, low=0, help="AdamW's, on matrices and conv kernels only")
    grad_clip: float = number(1.0, low=0, help="max global gradient norm; 0 disables")
    patience: int = number(8, low=0, help="early stopping: epochs without a better val metric; 0 disables")
    # Bounded so that every seed derived from it (+ rank, + epoch, * 1000 for synthetic data)
    # stays within what torch.manual_seed takes.
    seed: int = number(0, low=0, high=2**32 - 1, help="weights, data order, dropout, augmentation")
    # how to run it
    device: str = setting("auto", choices=DEVICE_CHOICES, help="auto: CUDA when available")
    amp: str = setting(
        "none", choices=AMP_CHOICES, help="autocast dtype; fp16 (with a GradScaler) needs CUDA"
    )
    checkpointing: bool = setting(False, help="activation checkpointing of the model's --blocks")
    # None: on. NHWC is what cuDNN's fast kernels want, and on the CPU it is where fastops' depthwise
    # kernels and oneDNN do best (digits model, 2 threads: 25.9 ms/step NHWC vs 33.0 ms NCHW with
    # fastops; stock 29.8 vs 30.2 ms).
    channels_last: bool | None = setting(None, help="NHWC images and conv weights (default: on)")
    compile: bool = setting(False, help="torch.compile the model (after DDP)")
    fsdp: bool = setting(False, help="under torchrun: shard the model with FSDP2 instead of DDP")
    num_workers: int = number(0, low=0, help="DataLoader worker processes")
    threads: int = number(
        0,
        low=0,
        high=2**31 - 1,
        help="CPU intra-op threads per process (0: torch's default); 1 is fastest for the small "
        "digits model on a machine shared with other jobs",
    )
    nonfinite: str = setting(
        "stop",
        choices=NONFINITE_CHOICES,
        help="on a NaN/inf training or validation loss: stop, or skip the step (--amp fp16)",
    )
    log_every: int = number(20, low=1, help="steps between progress-bar/NaN checks (the only host syncs)")
    profile: bool = setting(False, help="write a torch.profiler trace of a few steps into --out-dir")
    # where results go
    out_dir: Path = setting(default_factory=lambda: Path("runs/train"), help="run directory")
    resume: Path | None = setting(None, help="continue from this checkpoint (last.pt)")
    stop_after_epoch: int | None = number(
        None, int, low=1, optional=True, help="stop this invocation after that epoch (split a run in jobs)"
    )
    progress: bool = setting(True, help="tqdm progress bar on rank 0")

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def validate(self) -> TrainConfig:
        """Raise ConfigError for any setting that cannot work; return self."""

        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(f"fastops.train: {msg}")

        need(
            self.dataset in DATASET_CHOICES
            or all((Path(self.dataset) / sub).is_dir() for sub in ("train", "val")),
            f"--data must be one of {DATASET_CHOICES} or a directory with train/ and val/ "
            f"subfolders (ImageFolder layout), got {self.dataset!r}",
        )
        need(
            self.model == "convnet" or (":" in self.model and all(self.model.split(":", 1))),
            "--model must be convnet, timm:NAME, torchvision:NAME or package.module:factory, "
            f"got {self.model!r}",
        )
        need(
            isinstance(self.blocks, (tuple, list)) and all(isinstance(b, str) and b for b in self.blocks),
            f"--blocks must be a list of submodule or class names, got {self.blocks!r}",
        )
        for name, choices in (
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
        # Read by every fastops module at its first forward, after the data and model are built:
        # a typo is a usage error now rather than a traceback then.
        from fastops import policy

        backend = os.environ.get(policy.BACKEND_ENV, "")
        need(
            backend in ("", *policy.BACKENDS),
            f"the environment variable {policy.BACKEND_ENV}={backend!r} must be one of "
            f"{list(policy.BACKENDS)} (or unset)",
        )
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
