"""Checkpoints: atomic writes survive a crash mid-save, weights_only loads, and --resume continues a
run bit for bit (CPU, fp32)."""

from __future__ import annotations

import io
import os
import random
import re
import stat
import struct
import zipfile

import pytest
import torch
from torch import nn

from fastops.train import NonFiniteLossError, Trainer, checkpoint, run
from fastops.train.cli import main
from fastops.train.model import build_model
from tests.train.common import killed_before, tiny_config


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


def test_a_write_removes_what_a_kill_left_of_an_earlier_one(tmp_path) -> None:
    left = tmp_path / ".last.pt.0123456789abcdef.tmp"  # a kill during a save of last.pt
    left.write_bytes(b"half a checkpoint")
    others = [tmp_path / ".best.pt.0123456789abcdef.tmp", tmp_path / ".last.pt.mine.tmp"]
    for other in others:
        other.write_bytes(b"not a leftover of last.pt")
    checkpoint.atomic_save({"format": checkpoint.FORMAT_VERSION}, tmp_path / "last.pt")
    assert not left.exists() and all(other.exists() for other in others)


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
    full = run(cfg)
    first = run(cfg.replace(out_dir=tmp_path / "split", stop_after_epoch=1))
    assert first["epochs"] == 1 and first["stopped"] == "stop_after_epoch"
    resumed = run(cfg.replace(out_dir=tmp_path / "split", resume=tmp_path / "split" / "last.pt"))
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
    run(cfg)
    with pytest.raises(ValueError, match="epochs=2"):
        Trainer.from_config(cfg.replace(epochs=5, resume=tmp_path / "last.pt", stop_after_epoch=None))


def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path) -> None:
    trainer = Trainer.from_config(tiny_config(tmp_path, fastops=False, epochs=3, log_every=5))
    steps = trainer.steps_per_epoch
    calls = [0]

    def poison_after_first_epoch(module, inputs, output):
        calls[0] += 1
        if calls[0] > steps and module.training:
            return output * float("nan")
        return output

    trainer.module.head.register_forward_hook(poison_after_first_epoch)
    kept = f"the last good checkpoint ({tmp_path / 'last.pt'}, epoch 1) is kept"
    with pytest.raises(NonFiniteLossError, match=re.escape(kept)):
        trainer.fit()
    last = checkpoint.load(tmp_path / "last.pt")
    assert last["epoch"] == 1
    assert all(torch.isfinite(v).all() for v in last["model"].values() if v.is_floating_point())
    summary = (tmp_path / "summary.json").read_text()
    assert '"nonfinite_loss"' in summary


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished tiny run: a good last.pt and best.pt."""
    out = tmp_path_factory.mktemp("run")
    run(tiny_config(out, fastops=False, epochs=1))
    return out


def _flip_a_bit_in_the_largest_tensor(data: bytes) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = max(archive.infolist(), key=lambda i: i.file_size)
    # The record's bytes follow its 30-byte local header, file name and extra field.
    name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    return data[:at] + bytes([data[at] ^ 0x04]) + data[at + 1 :]


DAMAGES = {
    "truncated": lambda data: data[: len(data) // 2],
    "one byte short": lambda data: data[:-1],
    "empty": lambda data: b"",
    "random bytes": lambda data: random.Random(0).randbytes(len(data)),
    "flipped bits in the archive's directory": lambda data: data[:-40] + bytes(b ^ 0xFF for b in data[-40:]),
    "a flipped bit in a tensor": _flip_a_bit_in_the_largest_tensor,
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_is_named_and_the_good_one_pointed_to(run_dir, tmp_path, damage) -> None:
    damaged = run_dir / f"copy-{damage.replace(' ', '-')}.pt"
    damaged.write_bytes(DAMAGES[damage]((run_dir / "last.pt").read_bytes()))
    try:
        with pytest.raises(checkpoint.CheckpointError) as e:
            checkpoint.load(damaged, resumable=True)
    finally:
        damaged.unlink()
    message = str(e.value)
    assert repr(str(damaged)) in message and "is damaged" in message
    assert f"the last good checkpoint there is {str(run_dir / 'last.pt')!r} (epoch 1)" in message

    # last.pt itself damaged: nothing else to point to.
    (tmp_path / "last.pt").write_bytes(DAMAGES[damage]((run_dir / "last.pt").read_bytes()))
    with pytest.raises(checkpoint.CheckpointError, match="no other resumable checkpoint"):
        checkpoint.load(tmp_path / "last.pt", resumable=True)


def test_resume_from_best_pt_says_it_holds_weights_only(run_dir, capsys) -> None:
    best = run_dir / "best.pt"
    argv = ["--epochs", "1", "--image-size", "8", "--width", "8", "--device", "cpu", "--no-progress"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--out-dir", str(run_dir), "--resume", str(best)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{str(best)!r} holds model weights only" in err
    assert f"torch.load({str(best)!r}, weights_only=True)['model']" in err
    assert f"the last good checkpoint there is {str(run_dir / 'last.pt')!r} (epoch 1)" in err
    model, _ = build_model(in_channels=1, num_classes=10, image_size=8, width=8, dropout=0.1, fastops=False)
    model.load_state_dict(torch.load(best, weights_only=True)["model"])  # and the advice works


def test_files_that_are_not_resumable_checkpoints(tmp_path) -> None:
    torch.save(nn.Linear(2, 2), tmp_path / "module.pt")  # a pickled module, not weights
    with pytest.raises(checkpoint.CheckpointError, match="refuses to load"):
        checkpoint.load(tmp_path / "module.pt", resumable=True)
    torch.save({"format": checkpoint.FORMAT_VERSION, "model": {}, "epoch": 1, "step": 3}, tmp_path / "x.pt")
    with pytest.raises(checkpoint.CheckpointError, match="not a resumable .* no optimizer, scheduler"):
        checkpoint.load(tmp_path / "x.pt", resumable=True)


def test_resume_beside_a_damaged_or_foreign_best_pt_names_it(run_dir, tmp_path) -> None:
    # A checkpoint of epoch 2 whose best epoch is 1: resuming needs best.pt for the best weights.
    state = torch.load(run_dir / "last.pt", weights_only=True)
    assert state["early_stopping"]["best_epoch"] == 1
    checkpoint.atomic_save({**state, "epoch": 2}, tmp_path / "last.pt")
    cfg = tiny_config(tmp_path, fastops=False, epochs=1, resume=tmp_path / "last.pt")
    (tmp_path / "best.pt").write_bytes((run_dir / "best.pt").read_bytes()[:100])
    with pytest.raises(checkpoint.CheckpointError, match=r"best\.pt' is damaged .* move it away"):
        Trainer.from_config(cfg)
    best = torch.load(run_dir / "best.pt", weights_only=True)
    checkpoint.atomic_save({**best, "epoch": 2}, tmp_path / "best.pt")  # not the checkpoint's best
    with pytest.raises(checkpoint.CheckpointError, match=r"holds epoch 2, but the best epoch .* is 1"):
        Trainer.from_config(cfg)


def test_a_kill_between_last_pt_and_best_pt_is_repaired_on_resume(tmp_path, monkeypatch) -> None:
    cfg = tiny_config(tmp_path, fastops=False, epochs=3)
    with monkeypatch.context() as m:
        m.setattr(Trainer, "save", killed_before("best.pt", 2))
        with pytest.raises(KeyboardInterrupt):
            run(cfg)
    last = checkpoint.load(tmp_path / "last.pt")
    assert last["epoch"] == 2 and last["early_stopping"]["best_epoch"] == 2  # epoch 2 was the best
    assert checkpoint.load(tmp_path / "best.pt")["epoch"] == 1  # and best.pt was not yet written

    trainer = Trainer.from_config(cfg.replace(resume=tmp_path / "last.pt"))
    best = checkpoint.load(tmp_path / "best.pt")
    assert best["epoch"] == 2
    for key, value in last["model"].items():
        assert torch.equal(best["model"][key], value) and torch.equal(trainer.best_state[key], value)


def _saves(trainer: Trainer, monkeypatch) -> list[tuple[str, int]]:
    saved: list[tuple[str, int]] = []
    save = trainer.save

    def recording_save(path, state):
        saved.append((path.name, trainer.epoch))
        save(path, state)

    monkeypatch.setattr(trainer, "save", recording_save)
    return saved


def _finite(state: dict) -> bool:
    return all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


@pytest.mark.parametrize("use_fastops", [False, True], ids=["stock", "fastops"])
def test_a_nan_gradient_with_a_finite_loss_never_reaches_a_checkpoint(
    tmp_path, monkeypatch, use_fastops
) -> None:
    trainer = Trainer.from_config(tiny_config(tmp_path, fastops=use_fastops, epochs=3))
    steps = trainer.steps_per_epoch
    backwards = [0]

    def nan_gradient_in_the_last_step_of_epoch_2(grad):
        backwards[0] += 1
        return grad * float("nan") if backwards[0] == 2 * steps else grad

    trainer.module.head[-1].weight.register_hook(nan_gradient_in_the_last_step_of_epoch_2)
    checks = []
    all_finite = checkpoint.all_finite
    monkeypatch.setattr(checkpoint, "all_finite", lambda *a: checks.append(1) or all_finite(*a))
    saved = _saves(trainer, monkeypatch)
    with pytest.raises(
        NonFiniteLossError, match=r"weights or optimizer state became NaN/inf in epoch 2"
    ) as e:
        trainer.fit()
    assert f"the last good checkpoint ({tmp_path / 'last.pt'}, epoch 1) is kept" in str(e.value)
    assert len(checks) == 2  # one check (one host sync) per epoch, not per step
    assert ("last.pt", 2) not in saved and ("best.pt", 2) not in saved
    last = checkpoint.load(tmp_path / "last.pt", resumable=True)
    assert last["epoch"] == 1 and _finite(last["model"])
    assert _finite(checkpoint.load(tmp_path / "best.pt")["model"])


@pytest.mark.parametrize("nonfinite", ["stop", "skip"])
def test_a_nonfinite_validation_loss_counts_as_nonfinite_training(
    tmp_path, monkeypatch, capsys, nonfinite: str
) -> None:
    trainer = Trainer.from_config(tiny_config(tmp_path, fastops=False, epochs=3))
    # After validation: --nonfinite skip needs --amp fp16 and so CUDA, but the branch is host code.
    trainer.cfg = trainer.cfg.replace(nonfinite=nonfinite)

    def inf_logits_in_the_validation_of_epoch_2(module, inputs, output):
        return output * float("inf") if not module.training and trainer.epoch == 1 else output

    trainer.module.head.register_forward_hook(inf_logits_in_the_validation_of_epoch_2)
    saved = _saves(trainer, monkeypatch)
    if nonfinite == "stop":
        kept = f"the last good checkpoint ({tmp_path / 'last.pt'}, epoch 1) is kept"
        with pytest.raises(
            NonFiniteLossError,
            match=re.escape(f"validation loss is nan after epoch 2; the run is stopped and {kept}"),
        ):
            trainer.fit()
        assert checkpoint.load(tmp_path / "last.pt")["epoch"] == 1
    else:
        assert trainer.fit()["epochs"] == 3
        assert "validation loss is nan after epoch 2; no checkpoint of this epoch" in capsys.readouterr().out
        assert checkpoint.load(tmp_path / "last.pt")["epoch"] == 3
        assert trainer.early.best_epoch != 2
    assert ("last.pt", 2) not in saved and ("best.pt", 2) not in saved


def test_nonfinite_loss_before_any_checkpoint_says_none_is_kept(tmp_path) -> None:
    (tmp_path / "last.pt").write_bytes(b"a file of an earlier run, which is not this run's to keep")
    trainer = Trainer.from_config(tiny_config(tmp_path, fastops=False, epochs=2))
    trainer.module.head.register_forward_hook(lambda module, inputs, output: output * float("nan"))
    with pytest.raises(
        NonFiniteLossError, match="epoch 1\\); the run is stopped and no checkpoint had been written yet"
    ):
        trainer.fit()


def test_resume_refuses_a_checkpoint_with_nan_weights(run_dir, tmp_path) -> None:
    state = torch.load(run_dir / "last.pt", weights_only=True)
    next(v for v in state["model"].values() if v.is_floating_point()).view(-1)[0] = float("nan")
    checkpoint.atomic_save(state, tmp_path / "last.pt")
    with pytest.raises(checkpoint.CheckpointError, match="holds NaN/inf weights or optimizer state"):
        checkpoint.load(tmp_path / "last.pt", resumable=True)
