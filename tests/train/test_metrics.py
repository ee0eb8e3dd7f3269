"""Run records: metrics.csv holds one row per epoch however often a run is killed and resumed."""

from __future__ import annotations

import csv
import sys
import types

import pytest

from fastops.train import Trainer, checkpoint, run
from fastops.train.metrics import MetricsWriter
from tests.train.common import killed_before, tiny_config


def _csv_rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_metrics_csv_has_one_row_per_epoch_after_kills_and_resumes(tmp_path, monkeypatch) -> None:
    cfg = tiny_config(tmp_path, fastops=False, epochs=3)
    run(cfg.replace(stop_after_epoch=1))
    resume = cfg.replace(resume=tmp_path / "last.pt")

    # Killed twice between epoch 2's metrics row and its last.pt: each resume runs epoch 2 again.
    with monkeypatch.context() as m:
        m.setattr(Trainer, "save", killed_before("last.pt", 2))
        for _ in range(2):
            with pytest.raises(KeyboardInterrupt):
                run(resume)
    # And once more in the middle of writing a row: half a line, no newline.
    with open(tmp_path / "metrics.csv", "a") as f:
        f.write("2,38,0.00")

    run(resume)
    rows = _csv_rows(tmp_path / "metrics.csv")
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    history = checkpoint.load(tmp_path / "last.pt")["history"]
    for row, h in zip(rows, history, strict=True):
        assert float(row["val_loss"]) == h["val_loss"] and int(row["step"]) == h["step"]

    # A run resumed into another directory starts its metrics.csv with the checkpoint's rows.
    run(resume.replace(out_dir=tmp_path / "moved"))
    assert _csv_rows(tmp_path / "moved" / "metrics.csv") == rows


def test_tensorboard_hides_events_past_the_resumed_checkpoint(tmp_path, monkeypatch) -> None:
    opened = []

    class SummaryWriter:
        def __init__(self, log_dir: str, purge_step: int | None = None) -> None:
            opened.append(purge_step)

        def close(self) -> None:
            pass

    module = types.ModuleType("torch.utils.tensorboard")
    module.SummaryWriter = SummaryWriter  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    MetricsWriter(tmp_path, [{"epoch": 1, "step": 19}], step=19).close()
    assert opened == [20]  # events of steps 20 and up are from epochs about to be run again
