"""Run records: metrics.csv per epoch, TensorBoard events (when tensorboard is installed),
summary.json, early stopping, and the peak-memory probe."""

from __future__ import annotations

import csv
import io
import json
import resource
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from fastops.train.checkpoint import atomic_write

CSV_FIELDS = [
    "epoch",
    "step",
    "lr",
    "train_loss",
    "train_accuracy",
    "val_loss",
    "val_accuracy",
    "epoch_time_s",
    "samples_per_s",
]


class MetricsWriter:
    """metrics.csv, one row per epoch, and (``tensorboard=True``) the TensorBoard events.

    Each invocation starts metrics.csv afresh from ``history``, the rows the resumed checkpoint
    carries (none in a new run), written atomically like a checkpoint: rows of epochs past the
    checkpoint (written before a kill or crash, and about to be run again) and a row torn by a kill
    mid-write are dropped, and a run resumed into another directory gets its earlier rows too.
    TensorBoard is told to hide events past the checkpoint's ``step`` for the same reason.
    """

    def __init__(
        self,
        run_dir: Path,
        history: Sequence[dict[str, Any]] = (),
        *,
        step: int = 0,
        tensorboard: bool = True,
    ) -> None:
        self.path = run_dir / "metrics.csv"
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(history)
        atomic_write(self.path, lambda f: f.write(text.getvalue().encode()))
        self.tb = None
        if tensorboard:  # optional: the Trainer has said once when it is not installed
            from torch.utils.tensorboard import SummaryWriter

            # Events with a global step >= purge_step, left by an earlier invocation, are hidden.
            self.tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=step + 1)

    def write(self, row: dict[str, Any]) -> None:
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore").writerow(row)
        if self.tb is not None:
            for key in CSV_FIELDS[2:]:
                if row.get(key) is not None:
                    self.tb.add_scalar(key, row[key], row["step"])
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


@dataclass
class EarlyStopping:
    """Stop after ``patience`` epochs without a better validation accuracy (0: never stop)."""

    patience: int
    best: float = float("-inf")
    best_epoch: int = 0
    bad_epochs: int = 0

    def update(self, value: float, epoch: int) -> bool:
        """Record this epoch's value; True when it is a new best."""
        if value > self.best:
            self.best, self.best_epoch, self.bad_epochs = value, epoch, 0
            return True
        self.bad_epochs += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.bad_epochs >= self.patience

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of the run: CUDA's max allocated bytes on a GPU; on the CPU the process's peak
    resident set size (which includes the Python interpreter and torch itself)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def write_json(path: Path, obj: object) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
