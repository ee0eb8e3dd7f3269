"""Checkpoints: atomic writes, ``weights_only=True`` loads, and the RNG state of every rank.

A checkpoint holds only tensors and primitive containers (dict/list/str/int/float/bool/None), so it
loads with ``torch.load(..., weights_only=True)``, which never runs pickled code from the file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

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


def atomic_save(obj: object, path: str | os.PathLike[str]) -> None:
    """torch.save to ``path`` such that ``path`` always holds either the old or the new complete file.

    The bytes go to a temporary file in the same directory (same filesystem, so the rename is
    atomic), are flushed and fsync'ed to disk, then ``os.replace`` swaps the name over, and the
    directory is fsync'ed so the rename itself survives a power loss. A crash at any point leaves
    the previous checkpoint intact; only a stray ``.tmp`` file can remain, which is removed on error.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
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
