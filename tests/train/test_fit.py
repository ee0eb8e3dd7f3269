"""fit() on the user's own model and data: a model defined here, a Dataset or a ready DataLoader,
custom loss and metric, activation checkpointing by block, exact resume and clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fastops
from fastops.optim import FusedAdamW
from fastops.train import ConfigError, TrainConfig, Trainer, checkpoint, extras, fit

SMALL = dict(epochs=2, batch_size=16, device="cpu", progress=False, patience=0, log_every=4)


class TwoStageNet(nn.Module):
    """A user's model: two Sequential stages (Linear -> GELU, which fastops fuses) and a head."""

    def __init__(self, dim: int = 12, classes: int = 3) -> None:
        super().__init__()
        self.stage1 = nn.Sequential(nn.Linear(dim, 32), nn.GELU())
        self.stage2 = nn.Sequential(nn.Linear(32, 32), nn.GELU(), nn.Dropout(0.1))
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stage2(self.stage1(x)))


def _blobs(n: int, seed: int, dim: int = 12, classes: int = 3) -> TensorDataset:
    """Three separable Gaussian clusters: a model that learns reaches high accuracy in a few steps."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    centres = torch.randn(classes, dim, generator=torch.Generator().manual_seed(99)) * 3
    return TensorDataset(centres[y] + torch.randn(n, dim, generator=g), y)


def _model(seed: int = 0) -> TwoStageNet:
    torch.manual_seed(seed)
    return TwoStageNet()


def test_fit_trains_a_users_model_on_datasets_with_fastops(tmp_path) -> None:
    model = _model()
    summary = fit(model, _blobs(256, 1), _blobs(96, 2), test_data=_blobs(96, 3), out_dir=tmp_path, **SMALL)
    assert summary["steps"] == 2 * 256 // 16
    assert summary["swapped"]["nn.Linear -> fastops.nn.LinearGELU"] == 2
    assert isinstance(model.stage1[0], fastops.nn.LinearGELU)  # swapped in place
    assert summary["val_accuracy"] > 0.9 and summary["test_accuracy"] > 0.9
    for name in ("metrics.csv", "last.pt", "best.pt", "summary.json"):
        assert (tmp_path / name).is_file(), name
    assert (tmp_path / "curves.png").is_file() == extras.available("matplotlib")
    saved = checkpoint.load(tmp_path / "last.pt", resumable=True)
    assert set(saved["model"]) == set(model.state_dict())


def test_fit_takes_a_ready_loader_custom_loss_and_metric_and_no_validation(tmp_path) -> None:
    seen = {"loss": 0, "metric": 0}

    def loss_fn(outputs: torch.Tensor, batch) -> torch.Tensor:
        seen["loss"] += 1
        return nn.functional.cross_entropy(outputs.float(), batch[1], label_smoothing=0.1)

    def metric_fn(outputs: torch.Tensor, batch) -> torch.Tensor:
        seen["metric"] += 1
        return (outputs.argmax(-1) == batch[1]).sum() * 0 + len(batch[1])  # every sample scores 1

    loader = DataLoader(_blobs(128, 1), batch_size=32, shuffle=False)
    trainer = Trainer(
        _model(),
        loader,
        loss_fn=loss_fn,
        metric_fn=metric_fn,
        config=TrainConfig(**SMALL, fastops=False, out_dir=tmp_path),  # type: ignore[arg-type]
    )
    assert trainer.train_loader is loader and isinstance(trainer.optimizer, torch.optim.AdamW)
    summary = trainer.fit()
    assert seen["loss"] == seen["metric"] == 2 * 4
    assert trainer.history[-1]["train_accuracy"] == 1.0  # the user's metric, averaged over samples
    assert summary["val_accuracy"] is None and trainer.history[-1]["val_loss"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 8


def test_checkpointing_by_block_trains_like_the_plain_model(tmp_path) -> None:
    runs = {}
    for name, extra in (("plain", {}), ("ckpt", {"checkpointing": True, "blocks": ["stage1", "stage2"]})):
        model = _model()
        calls: list[int] = []
        # On the Dropout, which swap_modules keeps (it replaces the Linear).
        model.stage2[2].register_forward_pre_hook(lambda *a, calls=calls: calls.append(1))
        trainer = Trainer(
            model,
            _blobs(64, 1),
            _blobs(32, 2),
            config=TrainConfig(**{**SMALL, "epochs": 1}, out_dir=tmp_path / name, **extra),  # type: ignore[arg-type]
        )
        trainer.fit()
        runs[name] = (model.state_dict(), len(calls))
    (plain, plain_calls), (ckpt, ckpt_calls) = runs["plain"], runs["ckpt"]
    assert ckpt_calls == plain_calls + 4  # stage2 ran again in each step's backward: checkpointed
    for key, value in plain.items():
        torch.testing.assert_close(ckpt[key], value, msg=key)


def test_resume_of_a_users_model_is_bitwise_equal(tmp_path) -> None:
    cfg = TrainConfig(**{**SMALL, "epochs": 3}, out_dir=tmp_path / "full")  # type: ignore[arg-type]
    fit(_model(), _blobs(96, 1), _blobs(32, 2), config=cfg)
    fit(_model(), _blobs(96, 1), _blobs(32, 2), config=cfg, out_dir=tmp_path / "split", stop_after_epoch=2)
    # The resumed process builds its model afresh: the checkpoint restores weights, state and RNG.
    fit(_model(seed=5), _blobs(96, 1), _blobs(32, 2), config=cfg, out_dir=tmp_path / "split",
        resume=tmp_path / "split" / "last.pt")  # fmt: skip
    full = checkpoint.load(tmp_path / "full" / "last.pt")
    split = checkpoint.load(tmp_path / "split" / "last.pt")
    assert split["epoch"] == full["epoch"] == 3
    for key, value in full["model"].items():
        assert torch.equal(split["model"][key], value), key
    assert split["history"] == [{**h, **{k: split["history"][i][k] for k in ("epoch_time_s", "samples_per_s")}}
                                for i, h in enumerate(full["history"])]  # fmt: skip


def test_fit_uses_fused_adamw_for_fastops_and_rejects_bad_input(tmp_path) -> None:
    trainer = Trainer(_model(), _blobs(64, 1), config=TrainConfig(**SMALL, out_dir=tmp_path))  # type: ignore[arg-type]
    assert isinstance(trainer.optimizer, FusedAdamW)
    with pytest.raises(TypeError, match="model must be an nn.Module, got str"):
        fit("resnet", _blobs(64, 1), **SMALL)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="train_data must be a map-style"):
        fit(_model(), 42, out_dir=tmp_path, **SMALL)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--checkpointing needs the model's blocks"):
        fit(_model(), _blobs(64, 1), checkpointing=True, out_dir=tmp_path, **SMALL)
    with pytest.raises(ConfigError, match="'stage3' names no submodule of TwoStageNet"):
        fit(_model(), _blobs(64, 1), blocks=["stage3"], checkpointing=True, out_dir=tmp_path, **SMALL)
    with pytest.raises(ConfigError, match="--fsdp shards over the processes of torchrun"):
        fit(_model(), _blobs(64, 1), fsdp=True, out_dir=tmp_path, **SMALL)


class _Stream(torch.utils.data.IterableDataset):
    """A user's streaming dataset: no __len__, no indexing."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(_blobs(64, 1))


class _TupleNet(TwoStageNet):
    """Returns (logits, features), as models with auxiliary outputs do."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        features = self.stage2(self.stage1(x))
        return self.head(features), features


def test_fit_names_what_is_wrong_with_the_data_or_the_outputs(tmp_path) -> None:
    """An empty validation set was scored as loss 0 and accuracy 0 (early stopping fired, best.pt
    stayed at epoch 1); an IterableDataset failed inside the sampler; a tuple output failed in
    loop.py with "'tuple' object has no attribute 'float'"."""
    with pytest.raises(ConfigError, match=r"fastops\.train: val_data is empty"):
        fit(_model(), _blobs(64, 1), _blobs(0, 2), out_dir=tmp_path, **SMALL)
    with pytest.raises(ConfigError, match=r"fastops\.train: val_data is empty"):
        fit(_model(), _blobs(64, 1), DataLoader(_blobs(0, 2), batch_size=4), out_dir=tmp_path, **SMALL)
    for data in (_Stream(), DataLoader(_Stream(), batch_size=16)):
        with pytest.raises(TypeError, match=r"fastops\.train: train_data must be a map-style"):
            fit(_model(), data, out_dir=tmp_path, **SMALL)
    with pytest.raises(
        TypeError, match=r"default loss \(cross-entropy\) needs the model to return a tensor.*loss_fn"
    ):
        fit(_TupleNet(), _blobs(64, 1), out_dir=tmp_path, **SMALL)


def test_fit_takes_a_model_with_tuple_outputs_given_its_loss_and_metric(tmp_path) -> None:
    summary = fit(
        _TupleNet(),
        _blobs(64, 1),
        _blobs(32, 2),
        loss_fn=lambda out, batch: nn.functional.cross_entropy(out[0], batch[1]),
        metric_fn=lambda out, batch: (out[0].argmax(-1) == batch[1]).sum(),
        out_dir=tmp_path,
        **SMALL,
    )
    assert summary["val_accuracy"] is not None


def test_a_bad_fastops_backend_is_a_usage_error_up_front(monkeypatch, capsys) -> None:
    from fastops.train import cli

    monkeypatch.setenv("FASTOPS_BACKEND", "garbage")
    with pytest.raises(ConfigError, match=r"FASTOPS_BACKEND='garbage' must be one of"):
        TrainConfig(**SMALL).validate()  # type: ignore[arg-type]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--epochs", "1", "--device", "cpu", "--no-progress"])
    assert exit_info.value.code == 2
    assert "FASTOPS_BACKEND='garbage'" in capsys.readouterr().err
    # As users run it: the package's own import-time check answers before the CLI parses anything.
    env = {**os.environ, "FASTOPS_BACKEND": "garbage", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "fastops.train", "--epochs", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "FASTOPS_BACKEND='garbage'" in done.stderr and "Traceback" not in done.stderr
