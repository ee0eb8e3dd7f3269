"""Checkpoints: atomic writes, ``weights_only=True`` loads, and the RNG state of every rank.

A checkpoint holds only tensors and primitive containers (dict/list/str/int/float/bool/None), so it
loads with ``torch.load(..., weights_only=True)``, which never runs pickled code from the file.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import secrets
import stat
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from fastops.train.config import ConfigError

FORMAT_VERSION = 1


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's torch RNG states as tensors (CPU, and the CUDA device when in use)."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def all_finite(tensors: Iterable[object], device: torch.device) -> Tensor:
    """A boolean on ``device``: no floating-point tensor among ``tensors`` holds a NaN or an inf.

    No host sync of its own: one max-abs reduction per (device, dtype) group, which
    ``torch._foreach_norm`` (the kernel ``clip_grad_norm_`` uses) fuses into a few launches on CUDA.
    The infinity norm is NaN if any element is NaN, inf if any is inf, and cannot overflow.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
    for t in tensors:
        if hasattr(t, "to_local"):  # a DTensor (FSDP2): this rank checks its own shard
            t = t.to_local()  # type: ignore[union-attr]
        if isinstance(t, Tensor) and t.is_floating_point() and t.numel():  # inf norm of [] is an error
            groups.setdefault((t.device, t.dtype), []).append(t)
    finite = torch.ones((), dtype=torch.bool, device=device)
    for group in groups.values():
        norms = torch._foreach_norm(group, float("inf"))
        finite &= torch.stack(norms).isfinite().all().to(device)
    return finite


def training_state_tensors(model_state: dict[str, Any], optimizer_state: dict[Any, Any]) -> list[object]:
    """The tensors a checkpoint must not hold NaN/inf in: the model's parameters and buffers, and
    the optimizer's per-parameter state (``optimizer.state``, or ``state_dict()["state"]``)."""
    return [*model_state.values(), *(v for s in optimizer_state.values() for v in s.values())]


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Write a file through ``write(f)`` such that ``path`` always holds either the old or the new
    complete file.

    The bytes go to a temporary file in the same directory (same filesystem, so the rename is
    atomic), are flushed and fsync'ed to disk, then ``os.replace`` swaps the name over, and the
    directory is fsync'ed so the rename itself survives a power loss. A crash at any point leaves
    the previous file intact. The temporary file is removed on error; one left by a kill is removed
    by the next write of the same file.

    The file gets the permissions a plain ``open(path, "wb")`` (and so ``torch.save(obj, path)``)
    would give it: those of the file it replaces, else 0o666 less the umask. ``tempfile.mkstemp``
    would make it 0o600 whatever the umask.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"  # the name _leftovers matches
    # O_EXCL: never write into a file someone else created under that name. The mode is filtered
    # through the umask by the kernel, without changing the process-wide umask to read it.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            with contextlib.suppress(FileNotFoundError):
                os.chmod(f.fileno(), stat.S_IMODE(os.stat(path).st_mode))
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    for leftover in _leftovers(path):
        with contextlib.suppress(OSError):
            os.unlink(leftover)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _leftovers(path: Path) -> list[Path]:
    """Temporary files of earlier atomic_writes of ``path`` that a kill interrupted."""
    name = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{16}}\.tmp")
    return [path.parent / e.name for e in os.scandir(path.parent) if name.fullmatch(e.name)]


def atomic_save(obj: object, path: str | os.PathLike[str]) -> None:
    """torch.save to ``path`` through atomic_write: a crash mid-save keeps the previous checkpoint."""
    atomic_write(path, lambda f: torch.save(obj, f))


# Under FSDP2 the sharded entries (model weights, optimizer state) go to a torch.distributed.checkpoint
# directory beside the .pt file, which keeps the rest and names the directory under "sharded".
SHARDED_KEYS = ("model", "optimizer")


def save_sharded(state: dict[str, Any], path: Path, *, tag: int, is_main: bool) -> dict[str, Any]:
    """Write ``state``'s sharded entries with torch.distributed.checkpoint (every rank its own
    shards) into ``<name>.dcp.<tag>`` beside ``path``, then (rank 0) ``path`` atomically, holding
    the rest and the directory's name. Collective. Returns what ``path`` holds."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    directory = path.parent / f"{path.stem}.dcp.{tag}"
    sharded = {k: state[k] for k in SHARDED_KEYS if k in state}
    dcp.save(sharded, checkpoint_id=directory)
    rest = {k: v for k, v in state.items() if k not in SHARDED_KEYS}
    rest["sharded"] = directory.name
    rest["sharded_keys"] = list(sharded)
    dist.barrier()  # every rank's shards are on disk before the file that names them
    if is_main:
        atomic_save(rest, path)
    return rest


def remove_stale_shards(path: Path, keep: str) -> None:
    """The ``<name>.dcp.*`` directories beside ``path`` other than ``keep`` (superseded)."""
    import shutil

    for entry in path.parent.glob(f"{path.stem}.dcp.*"):
        if entry.name != keep and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)


def load_sharded(path: str | os.PathLike[str], ckpt: dict[str, Any], into: dict[str, Any]) -> dict[str, Any]:
    """Read the sharded entries of checkpoint ``path`` (already loaded as ``ckpt``) into the state
    dicts ``into`` (e.g. ``{"model": model.state_dict()}``), in place, and return it. Under a
    process group each rank reads its shards; in a single process (evaluation) the whole tensors."""
    import warnings

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        if not dist.is_initialized():  # DCP warns that it assumes one process: that is the intent
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(into, checkpoint_id=Path(path).parent / ckpt["sharded"])
    return into


def load_weights(path: str | os.PathLike[str], model: torch.nn.Module) -> dict[str, Any]:
    """Load the model weights of a checkpoint (last.pt or best.pt, sharded by FSDP2 or not) into
    ``model``, e.g. in a single process for evaluation; returns the checkpoint's other entries."""
    ckpt = load(path)
    if "sharded" in ckpt:
        ckpt["model"] = load_sharded(path, ckpt, {"model": model.state_dict()})["model"]
    model.load_state_dict(ckpt["model"])
    return ckpt


class CheckpointError(ConfigError):
    """A checkpoint file that cannot be used: damaged, not ours, or (for --resume) weights only.
    The message names the file and, for --resume, where the last good checkpoint is."""


# What Trainer.state_dict writes; a file without all of them is not a training state to resume.
RESUMABLE_KEYS = (
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "early_stopping",
    "epoch",
    "step",
    "rng",
    "history",
    "config",
)


def _damage(path: Path) -> str | None:
    """Why ``path`` is not an intact torch.save archive, or None.

    torch.save writes a zip archive with a CRC-32 per record. torch.load notices a damaged
    directory of the archive (with an error that does not name the file), but not flipped bits
    inside a tensor's bytes: those load as wrong weights. Reading every record through zipfile
    checks all the CRCs; it reads the file once more, once per resume.
    """
    if path.stat().st_size == 0:
        return "the file is empty"
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.CRC == 0 and info.file_size > 0:
                    continue  # written with torch.serialization.set_crc32_options(False)
                with archive.open(info) as record:
                    while record.read(1 << 24):  # raises BadZipFile at the end on a CRC mismatch
                        pass
    # Damage can surface as any of zipfile's errors (BadZipFile, EOFError, struct.error,
    # NotImplementedError for a garbled compression method, ...): each means the same thing here.
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def _resume_instead(path: Path) -> str:
    """Where to resume from instead of ``path``: the last.pt beside it, when that one is good."""
    last = path.parent / "last.pt"
    if last.is_file() and not last.samefile(path):
        with contextlib.suppress(CheckpointError, OSError):
            epoch = load(last, resumable=True)["epoch"]
            return f"the last good checkpoint there is {str(last)!r} (epoch {epoch})"
    return (
        f"there is no other resumable checkpoint in {str(path.parent)!r}; "
        "run without --resume to start afresh"
    )


def load(
    path: str | os.PathLike[str], map_location: torch.device | str = "cpu", *, resumable: bool = False
) -> dict[str, Any]:
    """Load a checkpoint with weights_only=True after checking that the file is intact, and check
    its format; with ``resumable``, also that it holds a whole training state (as last.pt does).

    Raises FileNotFoundError for a missing file and CheckpointError for any other file that cannot
    be used, with a message that names it, says what is wrong and, with ``resumable``, where the
    last good checkpoint is.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"fastops.train: no checkpoint file at {str(path)!r}")

    def fail(problem: str) -> CheckpointError:
        where = f"; {_resume_instead(path)}" if resumable else ""
        return CheckpointError(f"fastops.train: {str(path)!r} {problem}{where}")

    damage = _damage(path)
    if damage is not None:
        raise fail(f"is damaged or not a torch.save file ({damage})")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        raise fail(
            "is not a fastops.train checkpoint: it pickles Python objects that "
            "torch.load(weights_only=True) refuses to load"
        ) from e
    except torch.OutOfMemoryError:
        raise
    except Exception as e:  # an intact zip archive that is not a torch.save file
        reason = (str(e).strip().splitlines() or [""])[0]
        raise fail(f"is not a checkpoint torch.load can read ({type(e).__name__}: {reason})") from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT_VERSION:
        raise fail(f"is not a fastops.train checkpoint (format {FORMAT_VERSION})")
    if "sharded" in ckpt:
        if not (path.parent / ckpt["sharded"]).is_dir():
            raise fail(
                f"names the sharded checkpoint directory {ckpt['sharded']!r} beside it, which is missing"
            )
        ckpt = {**{key: {} for key in ckpt.get("sharded_keys", ())}, **ckpt}
    missing = [key for key in RESUMABLE_KEYS if key not in ckpt]
    if resumable and missing == [key for key in RESUMABLE_KEYS if key not in ("model", "epoch")]:
        raise fail(
            "holds model weights only (best.pt: the weights of the best epoch), not a training "
            "state to resume from; to use the weights: "
            f"model.load_state_dict(torch.load({str(path)!r}, weights_only=True)['model'])"
        )
    if resumable and missing:
        raise fail(f"is not a resumable fastops.train checkpoint (it has no {', '.join(missing)})")
    # (A sharded checkpoint's weights were checked by every rank before they were written.)
    if (
        resumable
        and "sharded" not in ckpt
        and not all_finite(
            training_state_tensors(ckpt["model"], ckpt["optimizer"]["state"]), torch.device("cpu")
        )
    ):
        # Written before the loop refused to save non-finite weights: resuming would only stop again.
        raise fail("holds NaN/inf weights or optimizer state, so training cannot go on from it")
    return ckpt
