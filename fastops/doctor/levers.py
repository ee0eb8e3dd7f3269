"""The speed levers the doctor tries: one :class:`Lever` per option, in one registry, in trial order.

A lever says where it applies (:attr:`Lever.applies`), how it changes a trial (:attr:`Lever.apply`,
a function of the frozen :class:`TrialConfig`) and which lines a user writes to get it
(:attr:`Lever.code`). Levers of one ``group`` are alternatives (three optimizers, two batch sizes):
the combination takes the best of each group. A new lever is one :func:`register_lever` call.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import functools
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

# glibc serves a block of at least the mmap threshold (128 KiB, raised dynamically up to 32 MiB) with
# a fresh mmap and unmaps it on free, so every large activation is page-faulted again each step;
# above 128 KiB of free heap top it also trims the heap. mallopt caps the threshold at 32 MiB, so the
# lever switches mmap off instead (the heap then serves every block and reuses it) and never trims.
GLIBC_KEEP_MEMORY = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**34)}


@dataclass(frozen=True)
class TrialConfig:
    """Everything a trial changes from the baseline (the model as given, fp32, contiguous, the
    baseline optimizer, cudnn.benchmark off, the example batch's size, no loader workers)."""

    amp: str = "none"  # "none", "bf16", "fp16" (fp16: with a GradScaler, CUDA only)
    channels_last: bool = False
    swap: bool = False  # fastops.swap_modules (and fastops.tune where it exists)
    optimizer: str = "baseline"  # "baseline", "fastops", "foreach", "fused"
    compile: bool = False
    cudnn_benchmark: bool = False
    checkpointing: bool = False
    batch_scale: int = 1  # the batch is this many times the example batch
    num_workers: int = 0  # DataLoader workers, with data=
    pin_memory: bool = False
    env: tuple[tuple[str, str], ...] = ()  # the trial process's extra environment (allocator levers)

    def replace(self, **changes: object) -> TrialConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def merged(self, other: TrialConfig) -> TrialConfig:
        """This config with every field ``other`` changes from the baseline (for combinations)."""
        base = TrialConfig()
        changes = {
            f.name: getattr(other, f.name)
            for f in dataclasses.fields(self)
            if getattr(other, f.name) != getattr(base, f.name)
        }
        if "env" in changes:
            changes["env"] = tuple(sorted({**dict(self.env), **dict(other.env)}.items()))
        return self.replace(**changes)


@dataclass(frozen=True)
class Context:
    """What a lever's ``applies`` may look at: the device, the example batch's inputs, the model's
    candidate blocks, whether a Dataset was given, and the baseline optimizer's class."""

    device: torch.device
    input_dims: int  # dims of the example inputs (4 for images); 0 if they are not a tensor
    has_data: bool
    optimizer_class: type
    blocks: tuple[str, ...]
    swappable: int  # modules fastops.swap_modules would replace


@dataclass(frozen=True)
class Lever:
    """One option the doctor tries alone, then in the combination.

    ``applies(ctx)`` returns None where the lever applies, else why not (listed as skipped).
    ``apply(cfg)`` returns the trial config with the lever on. ``code`` is what to write to apply it.
    ``cost`` scales the baseline trial's wall time into this trial's estimate (``extra_s`` on top:
    torch.compile's compilation), which the budget is checked against before the trial starts.
    ``memory_lever`` marks levers run for the memory they save, not for speed (checkpointing).
    """

    name: str
    group: str
    applies: Callable[[Context], str | None]
    apply: Callable[[TrialConfig], TrialConfig]
    code: tuple[str, ...]
    cost: float = 1.0
    extra_s: float = 0.0
    memory_lever: bool = False


_REGISTRY: list[Lever] = []


def register_lever(lever: Lever) -> Lever:
    """Add ``lever`` to the registry; levers run in registration order. Returns it."""
    if not isinstance(lever, Lever):
        raise TypeError(f"fastops.doctor.register_lever: expected a Lever, got {type(lever).__name__}")
    if any(existing.name == lever.name for existing in _REGISTRY):
        raise ValueError(f"fastops.doctor.register_lever: a lever named {lever.name!r} is already registered")
    _REGISTRY.append(lever)
    return lever


def levers(names: Sequence[str] | None = None) -> list[Lever]:
    """The registered levers in trial order; with ``names``, only those (ValueError for an unknown one)."""
    if names is None:
        return list(_REGISTRY)
    known = {lever.name: lever for lever in _REGISTRY}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"fastops.doctor: levers: unknown {unknown}; the levers are {sorted(known)}")
    return [lever for lever in _REGISTRY if lever.name in names]


def _always(ctx: Context) -> str | None:
    return None


def _cuda_only(ctx: Context) -> str | None:
    return None if ctx.device.type == "cuda" else "CUDA only"


def _bf16(ctx: Context) -> str | None:
    if ctx.device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    return None


def _images(ctx: Context) -> str | None:
    return None if ctx.input_dims == 4 else "the inputs are not 4-D images"


def _swappable(ctx: Context) -> str | None:
    return None if ctx.swappable else "fastops.swap_modules finds nothing to replace in this model"


def _adam_family(ctx: Context) -> str | None:
    if issubclass(ctx.optimizer_class, (torch.optim.Adam, torch.optim.AdamW)):
        return None
    return f"the optimizer is {ctx.optimizer_class.__name__}, not Adam or AdamW"


def _blocks(ctx: Context) -> str | None:
    return None if ctx.blocks else "no blocks found to checkpoint (pass blocks=[...] / --blocks)"


def _with_data(ctx: Context) -> str | None:
    return None if ctx.has_data else "needs data= (a Dataset) or --data digits|DIR"


def _glibc(ctx: Context) -> str | None:
    if ctx.device.type != "cpu":
        return "CPU only"
    if platform.libc_ver()[0] != "glibc":
        return "not a glibc system"
    return None


def preload_library(name: str) -> str | None:
    """The path of an installed malloc library (``jemalloc``, ``tcmalloc``), or None."""
    found = ctypes.util.find_library(name)
    if found is None:
        return None
    if os.path.isabs(found):
        return found
    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"):
        if (Path(folder) / found).is_file():
            return str(Path(folder) / found)
    return found  # a soname the loader resolves by itself


def _preload(name: str) -> Callable[[Context], str | None]:
    def applies(ctx: Context) -> str | None:
        if ctx.device.type != "cpu":
            return "CPU only"
        return None if preload_library(name) else f"lib{name} is not installed"

    return applies


def _preload_env(name: str) -> Callable[[TrialConfig], TrialConfig]:
    def apply(cfg: TrialConfig) -> TrialConfig:
        return cfg.replace(env=(("LD_PRELOAD", preload_library(name) or f"lib{name}.so"),))

    return apply


def _default_workers() -> int:
    # One worker per spare core, at most 4: more rarely helps a single training process.
    return max(1, min(4, (os.cpu_count() or 2) - 1))


AMP_CPU = "with torch.autocast(device.type, dtype=torch.bfloat16):  # around forward + loss, not backward"
# The order is the trial order: cheap, likely levers first; compile, batch size and the allocator last.
BUILTIN = (
    Lever(
        "amp-bf16",
        "amp",
        _bf16,
        lambda c: c.replace(amp="bf16"),
        (AMP_CPU,),
    ),
    Lever(
        "amp-fp16",
        "amp",
        _cuda_only,
        lambda c: c.replace(amp="fp16"),
        (
            'scaler = torch.amp.GradScaler("cuda")',
            'with torch.autocast("cuda", dtype=torch.float16): loss = loss_fn(model(x), y)',
            "scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()",
        ),
    ),
    Lever(
        "channels-last",
        "memory format",
        _images,
        lambda c: c.replace(channels_last=True),
        (
            "model = model.to(memory_format=torch.channels_last)",
            "x = x.to(memory_format=torch.channels_last)  # each batch",
        ),
    ),
    Lever(
        "fastops-swap",
        "fastops modules",
        _swappable,
        lambda c: c.replace(swap=True),
        # The trial measures the kernel choices ahead, as fastops.tune does (before torch.compile).
        ("fastops.swap_modules(model)", "fastops.tune(model, example_inputs)  # before torch.compile"),
    ),
    Lever(
        "fused-adamw",
        "optimizer",
        _adam_family,
        lambda c: c.replace(optimizer="fastops"),
        ("optimizer = fastops.optim.FusedAdamW(params, ...)  # FusedAdam for Adam",),
    ),
    Lever(
        "adamw-foreach",
        "optimizer",
        _adam_family,
        lambda c: c.replace(optimizer="foreach"),
        ("optimizer = torch.optim.AdamW(params, ..., foreach=True)",),
    ),
    Lever(
        "adamw-fused",
        "optimizer",
        _adam_family,
        lambda c: c.replace(optimizer="fused"),
        ("optimizer = torch.optim.AdamW(params, ..., fused=True)",),
    ),
    Lever(
        "cudnn-benchmark",
        "cudnn",
        _cuda_only,
        lambda c: c.replace(cudnn_benchmark=True),
        ("torch.backends.cudnn.benchmark = True",),
    ),
    Lever(
        "loader-workers",
        "data loader",
        _with_data,
        lambda c: c.replace(num_workers=_default_workers(), pin_memory=torch.cuda.is_available()),
        (
            f"DataLoader(..., num_workers={_default_workers()}, persistent_workers=True"
            + (
                ", pin_memory=True)  # and .to(device, non_blocking=True)"
                if torch.cuda.is_available()
                else ")"
            ),
        ),
    ),
    Lever(
        "checkpointing",
        "checkpointing",
        _blocks,
        lambda c: c.replace(checkpointing=True),
        ("fastops.train.activation_checkpointing.checkpoint_blocks(model, BLOCKS)",),
        memory_lever=True,
    ),
    Lever(
        "compile",
        "compile",
        _always,
        lambda c: c.replace(compile=True),
        ("model = torch.compile(model)",),
        cost=1.5,
        extra_s=60.0,
    ),
    # Larger batches, the example batch repeated (stopped at the first size that runs out of memory).
    *(
        Lever(
            f"batch-x{k}",
            "batch size",
            _always,
            functools.partial(TrialConfig.replace, batch_scale=k),
            (f"batch_size *= {k}  # and scale the learning rate to match",),
            cost=1 + (k - 1) / 2,  # the timed part grows with the batch, the process start does not
        )
        for k in (2, 4)
    ),
    Lever(
        "glibc-malloc",
        "allocator",
        _glibc,
        lambda c: c.replace(env=tuple(GLIBC_KEEP_MEMORY.items())),
        (" ".join(f"{k}={v}" for k, v in GLIBC_KEEP_MEMORY.items()) + " python train.py",),
    ),
    *(
        Lever(
            name,
            "allocator",
            _preload(name),
            _preload_env(name),
            (f"LD_PRELOAD={preload_library(name) or soname} python train.py",),
        )
        for name, soname in (("jemalloc", "libjemalloc.so.2"), ("tcmalloc", "libtcmalloc.so.4"))
    ),
)
for _lever in BUILTIN:
    register_lever(_lever)


def code_lines(chosen: Sequence[Lever]) -> list[str]:
    """The lines that apply ``chosen``, in trial order, each once."""
    lines: list[str] = []
    for lever in chosen:
        lines += [line for line in lever.code if line not in lines]
    return lines
