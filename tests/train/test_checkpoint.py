"""Checkpoints: atomic writes survive a crash mid-save, weights_only loads, and --resume continues a
run bit for bit (CPU, fp32)."""

from __future__ import annotations

import os
import stat

import pytest
import torch

from fastops.train import NonFiniteLossError, Trainer, checkpoint, fit
from tests.train.common import tiny_config


def test_crash_mid_save_keeps_the_last_checkpoint(tmp_path, monkeypatch) -> None:
    path = tmp_path / "last.pt"
    good = {"format": checkpoint.FORMAT_VERSION, "w": torch.arange(5.0), "rng": [torch.get_rng_state()]}
    checkpoint.atomic_save(good, path)

    real_save = torch.save

    def crash_after_partial_write(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(f.tell() // 2)  # half a file on disk, then the process "dies"
        raise KeyboardInterrupt("simulated crash during the write")

    monkeypatch.setattr(checkpoint.torch, "save", crash_after_partial_write)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.atomic_save({"format": checkpoint.FORMAT_VERSION, "w": torch.zeros(5)}, path)
    monkeypatch.undo()

    loaded = checkpoint.load(path)
    assert torch.equal(loaded["w"], good["w"])
    assert torch.equal(loaded["rng"][0], good["rng"][0])
    assert sorted(os.listdir(tmp_path)) == ["last.pt"]  # no stray temporary file


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002], ids=lambda m: f"umask{m:03o}")
def test_checkpoints_get_the_permissions_torch_save_gives(tmp_path, umask: int) -> None:
    state = {"format": checkpoint.FORMAT_VERSION, "w": torch.arange(3.0)}
    before = os.umask(umask)
    try:
        torch.save(state, tmp_path / "plain.pt")
        checkpoint.atomic_save(state, tmp_path / "last.pt")
    finally:
        os.umask(before)
    mode = lambda name: stat.S_IMODE(os.stat(tmp_path / name).st_mode)  # noqa: E731
    assert mode("last.pt") == mode("plain.pt") == 0o666 & ~umask
    # Replacing a file keeps its permissions, as torch.save's open(path, "wb") does.
    os.chmod(tmp_path / "last.pt", 0o640)
    checkpoint.atomic_save(state, tmp_path / "last.pt")
    assert mode("last.pt") == 0o640


def test_load_rejects_missing_and_foreign_files(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint file"):
        checkpoint.load(tmp_path / "nope.pt")
    torch.save({"something": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a fastops.train checkpoint"):
        checkpoint.load(tmp_path / "other.pt")


def test_resume_is_bitwise_equal_to_an_uninterrupted_run(tmp_path) -> None:
    # The main job's path (fastops modules, FusedAdamW), with dropout and augmentation on: the RNG
    # state must travel in the checkpoint too.
    cfg = tiny_config(tmp_path / "full", epochs=3, dropout=0.2, augment=True)
    full = fit(cfg)
    first = fit(cfg.replace(out_dir=tmp_path / "split", stop_after_epoch=1))
    assert first["epochs"] == 1 and first["stopped"] == "stop_after_epoch"
    resumed = fit(cfg.replace(out_dir=tmp_path / "split", resume=tmp_path / "split" / "last.pt"))
    assert resumed["epochs"] == 3 and resumed["stopped"] == "completed"

    a = checkpoint.load(tmp_path / "full" / "last.pt")
    b = checkpoint.load(tmp_path / "split" / "last.pt")
    for key, value in a["model"].items():
        assert torch.equal(b["model"][key], value), key
    for pid, state in a["optimizer"]["state"].items():
        for k, v in state.items():
            assert torch.equal(b["optimizer"]["state"][pid][k], v), (pid, k)
    assert b["scheduler"] == a["scheduler"]
    assert b["step"] == a["step"] and b["epoch"] == a["epoch"] == 3
    assert torch.equal(b["rng"][0]["cpu"], a["rng"][0]["cpu"])
    for ha, hb in zip(a["history"], b["history"], strict=True):
        for k in ("train_loss", "train_accuracy", "val_loss", "val_accuracy", "lr"):
            assert ha[k] == hb[k], (ha["epoch"], k)
    assert full["test_accuracy"] == resumed["test_accuracy"]
    rows = (tmp_path / "split" / "metrics.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 3  # header and one row per epoch, across both invocations


def test_resume_with_a_different_schedule_is_refused(tmp_path) -> None:
    cfg = tiny_config(tmp_path, fastops=False, epochs=2, stop_after_epoch=1)
    fit(cfg)
    with pytest.raises(ValueError, match="epochs=2"):
        Trainer(cfg.replace(epochs=5, resume=tmp_path / "last.pt", stop_after_epoch=None))


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path) -> None:
    trainer = Trainer(tiny_config(tmp_path, fastops=False, epochs=3, log_every=5))
    steps = trainer.steps_per_epoch
    calls = [0]

    def poison_after_first_epoch(module, inputs, output):
        calls[0] += 1
        if calls[0] > steps and module.training:
            return output * float("nan")
        return output

    trainer.module.head.register_forward_hook(poison_after_first_epoch)
    with pytest.raises(NonFiniteLossError, match="NaN/inf"):
        trainer.fit()
    last = checkpoint.load(tmp_path / "last.pt")
    assert last["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in last["model"].values() if v.is_floating_point())
    summary = (tmp_path / "summary.json").read_text()
    assert '"nonfinite_loss"' in summary
