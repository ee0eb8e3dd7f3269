"""The CLI: the main job's smoke run, --compare, and clear errors for settings that cannot work."""

from __future__ import annotations

import json

import pytest
import torch

from fastops.train import TrainConfig
from fastops.train.cli import build_parser, main
from fastops.train.config import ConfigError

TINY = ["--epochs", "1", "--image-size", "8", "--width", "8", "--no-progress", "--device", "cpu"]


def test_main_job_smoke_run(tmp_path, capsys) -> None:
    assert main([*TINY, "--out-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("val_accuracy", "train_loss", "samples_per_s", "peak_memory_mb", "epochs", "device", "amp"):
        assert summary[key] is not None, key
    assert summary["fastops"] is True and summary["epochs"] == 1 and summary["device"] == "cpu"
    assert summary["swapped"]["nn.Conv2d -> fastops.nn.DepthwiseConv2d"] > 0
    assert 0.0 <= summary["test_accuracy"] <= 1.0
    for name in ("metrics.csv", "curves.png", "last.pt", "best.pt"):
        assert (tmp_path / name).is_file(), name
    assert "held-out test acc" in capsys.readouterr().out


def test_compare_writes_table_and_chart(tmp_path, capsys) -> None:
    assert main([*TINY, "--compare", "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| fastops |" in out and "| stock |" in out and "fastops / stock throughput" in out
    assert (tmp_path / "compare.png").is_file() and (tmp_path / "compare.md").is_file()
    results = json.loads((tmp_path / "compare.json").read_text())
    assert results["fastops"]["fastops"] is True and results["stock"]["fastops"] is False
    assert results["stock"]["amp"] == "none"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--amp", "fp32"], "invalid choice: 'fp32'"),
        (["--device", "tpu"], "invalid choice: 'tpu'"),
        (["--batch-size", "0"], "expected an integer >= 1, got 0"),
        (["--batch-size", "many"], "expected an integer >= 1, got 'many'"),
        (["--resume", "/nonexistent/last.pt"], "no checkpoint file at '/nonexistent/last.pt'"),
        (["--baseline", "--compare"], "not allowed with argument"),
        (["--nonfinite", "skip"], "--nonfinite skip needs --amp fp16"),
    ],
)
def test_bad_settings_fail_with_clear_errors(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_fp16_and_cuda_need_a_gpu(capsys) -> None:
    for argv, message in (
        (["--amp", "fp16"], "--amp fp16 needs a CUDA device"),
        (["--device", "cuda"], "CUDA is not available"),
    ):
        with pytest.raises(SystemExit):
            main(argv)
        assert message in capsys.readouterr().err


def test_config_validation_in_the_library() -> None:
    with pytest.raises(ConfigError, match="--batch-size must be an integer >= 1, got 0"):
        TrainConfig(batch_size=0).validate()
    with pytest.raises(ConfigError, match="--dropout"):
        TrainConfig(dropout=1.5).validate()
    with pytest.raises(ConfigError, match="--amp must be one of"):
        TrainConfig(amp="int8").validate()


def test_help_lists_the_main_options(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--baseline",
        "--compare",
        "--synthetic",
        "--amp",
        "--checkpointing",
        "--resume",
        "torchrun",
    ):
        assert flag in out, flag


def test_synthetic_throughput_mode_runs(tmp_path) -> None:
    argv = ["--synthetic", "--image-size", "72", "--batch-size", "4", "--synthetic-samples", "16"]
    argv += ["--epochs", "1", "--width", "8", "--no-progress", "--device", "cpu", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["dataset"] == "synthetic" and summary["config"]["image_size"] == 72
    assert summary["steps"] == 4 and summary["test_accuracy"] is None
