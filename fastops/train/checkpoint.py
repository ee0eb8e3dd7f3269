"""Checkpoints: atomic writes, ``weights_only=True`` loads, and the RNG state of every rank.

A checkpoint holds only tensors and primitive containers (dict/list/str/int/float/bool/None), so it
loads with ``torch.load(..., weights_only=True)``, which never runs pickled code from the file.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch

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


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Write a file through ``write(f)`` such that ``path`` always holds either the old or the new
    complete file.

    The bytes go to a temporary file in the same directory (same filesystem, so the rename is
    atomic), are flushed and fsync'ed to disk, then ``os.replace`` swaps the name over, and the
    directory is fsync'ed so the rename itself survives a power loss. A crash at any point leaves
    the previous file intact; only a stray ``.tmp`` file can remain, which is removed on error.

    The file gets the permissions a plain ``open(path, "wb")`` (and so ``torch.save(obj, path)``)
    would give it: those of the file it replaces, else 0o666 less the umask. ``tempfile.mkstemp``
    would make it 0o600 whatever the umask.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
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
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_save(obj: object, path: str | os.PathLike[str]) -> None:
    """torch.save to ``path`` through atomic_write: a crash mid-save keeps the previous checkpoint."""
    atomic_write(path, lambda f: torch.save(obj, f))


def load(path: str | os.PathLike[str], map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Load a checkpoint with weights_only=True and check its format."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"fastops.train: no checkpoint file at {str(path)!r}")
    ckpt = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"fastops.train: {str(path)!r} is not a fastops.train checkpoint (format {FORMAT_VERSION})"
        )
    return ckpt
