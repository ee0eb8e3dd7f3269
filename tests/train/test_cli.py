"""The CLI: the main job's smoke run, --compare, and clear errors for settings that cannot work."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re

import pytest
import torch

from fastops.train import TrainConfig, run
from fastops.train.cli import build_parser, main
from fastops.train.config import NUMBERS, ConfigError

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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lr", "inf"], "argument --lr: expected a finite number > 0, got inf"),
        (["--baseline", "--lr", "inf"], "argument --lr: expected a finite number > 0, got inf"),
        (["--lr", "nan"], "argument --lr: expected a finite number > 0, got nan"),
        (["--lr", "0"], "argument --lr: expected a finite number > 0, got 0"),
        (["--seed", "99999999999999999999"], "argument --seed: expected an integer in [0, 4294967295]"),
        (["--seed", "-1"], "argument --seed: expected an integer in [0, 4294967295], got -1"),
        (["--width", "99999999999999999999"], "argument --width: expected an integer >= 1 and at most 2**63"),
        (["--weight-decay", "inf"], "argument --weight-decay: expected a finite number >= 0, got inf"),
        (["--grad-clip", "nan"], "argument --grad-clip: expected a finite number >= 0, got nan"),
        (["--dropout", "1"], "argument --dropout: expected a finite number in [0, 1), got 1"),
        (["--patience", "-1"], "argument --patience: expected an integer >= 0, got -1"),
        (["--threads", "-2"], "argument --threads: expected an integer in [0, 2147483647], got -2"),
        (["--num-workers", "-1"], "argument --num-workers: expected an integer >= 0, got -1"),
        (["--num-classes", "1"], "argument --num-classes: expected an integer >= 2, got 1"),
        (["--image-size", "4"], "argument --image-size: expected an integer >= 8, got 4"),
        (["--stop-after-epoch", "0"], "argument --stop-after-epoch: expected an integer >= 1, got 0"),
    ],
)
def test_numeric_flags_are_checked_before_anything_is_built(argv, message, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main([*TINY, *argv, "--out-dir", str(tmp_path / "run")])
    assert e.value.code == 2
    assert f"error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_every_numeric_setting_is_checked_alike_by_the_cli_and_the_library(tmp_path) -> None:
    numeric = {f.name for f in dataclasses.fields(TrainConfig) if f.type in ("int", "float", "int | None")}
    assert set(NUMBERS) == numeric
    parser = build_parser()
    parser.exit_on_error = False  # raise argparse.ArgumentError instead
    for name, spec in NUMBERS.items():
        flag = "--" + name.replace("_", "-")
        bad = "inf" if spec.kind is float else str(spec.low - 1)
        with pytest.raises(argparse.ArgumentError, match=re.escape(f"expected {spec.describe()}, got {bad}")):
            parser.parse_args([flag, bad])
        with pytest.raises(
            ConfigError, match=re.escape(f"{flag} must be {spec.describe()}, got {spec.kind(bad)!r}")
        ):
            TrainConfig(**{name: spec.kind(bad)}).validate()
    with pytest.raises(ConfigError, match="--lr must be a finite number > 0, got inf"):
        run(TrainConfig(lr=float("inf"), out_dir=tmp_path / "run"))
    with pytest.raises(ConfigError, match="--seed must be an integer in"):
        run(TrainConfig(seed=10**20, out_dir=tmp_path / "run"))
    with pytest.raises(ConfigError, match="--epochs must be an integer >= 1, got 2.0"):
        run(TrainConfig(epochs=2.0, out_dir=tmp_path / "run"))  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_help_lists_the_main_options(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--baseline",
        "--compare",
        "--data",
        "--model",
        "--fsdp",
        "--amp",
        "--checkpointing",
        "--resume",
        "torchrun",
    ):
        assert flag in out, flag


def test_synthetic_throughput_mode_runs(tmp_path) -> None:
    argv = ["--data", "synthetic", "--image-size", "72", "--batch-size", "4", "--synthetic-samples", "16"]
    argv += ["--epochs", "1", "--width", "8", "--no-progress", "--device", "cpu", "--out-dir", str(tmp_path)]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["dataset"] == "synthetic" and summary["config"]["image_size"] == 72
    assert summary["steps"] == 4 and summary["test_accuracy"] is None


def test_the_parser_is_generated_from_the_config_with_each_default_shown_once() -> None:
    parser = build_parser()
    options = {a.dest: a for a in parser._actions}
    for f in dataclasses.fields(TrainConfig):
        assert f.name in options, f"TrainConfig.{f.name} has no option"
        help_text = options[f.name].help or ""
        assert help_text.startswith(f.metadata["help"]), f.name
        assert help_text.count("(default") <= 1, help_text
    given = parser.parse_args(["--data", "synthetic", "--blocks", "layer1", "Bottleneck", "--no-fastops"])
    from fastops.train.cli import config_from_args

    cfg = config_from_args(given)
    assert (cfg.dataset, cfg.image_size, cfg.epochs) == ("synthetic", 224, 3)
    assert cfg.blocks == ("layer1", "Bottleneck") and cfg.fastops is False
    assert config_from_args(parser.parse_args([])) == TrainConfig()


def test_a_users_factory_trains_from_the_command_line(tmp_path, capsys) -> None:
    argv = [*TINY, "--epochs", "2", "--model", "tests.train.user_models:small_mlp", "--blocks", "1", "2"]
    assert main([*argv, "--checkpointing", "--patience", "0", "--out-dir", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["config"]["model"] == "tests.train.user_models:small_mlp"
    assert summary["swapped"]["nn.Linear -> fastops.nn.LinearGELU"] == 2
    assert summary["val_accuracy"] > 0.5  # ten digit classes: it learned
    saved = torch.load(tmp_path / "last.pt", weights_only=True)["model"]
    assert "1.0.weight" in saved and "3.bias" in saved  # the factory's own state_dict keys


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("tests.train.no_such_module:f", "cannot import 'tests.train.no_such_module'"),
        ("tests.train.user_models:missing", "'tests.train.user_models' has no callable 'missing'"),
        ("tests.train.user_models:NOT_A_FACTORY", "has no callable 'NOT_A_FACTORY'"),
        ("resnet18", "--model must be convnet, timm:NAME, torchvision:NAME or package.module:factory"),
    ],
)
def test_a_bad_model_spec_is_named_before_training(model: str, message: str, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main([*TINY, "--model", model, "--out-dir", str(tmp_path / "run")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_blocks_that_name_nothing_are_an_error(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(
            [
                *TINY,
                "--model",
                "tests.train.user_models:small_mlp",
                "--blocks",
                "layer1",
                "--out-dir",
                str(tmp_path),
            ]
        )
    assert "'layer1' names no submodule of Sequential" in capsys.readouterr().err


def _image_folder(root, classes: int = 2, per_class: int = 6) -> None:
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for c in range(classes):
            (root / split / f"class{c}").mkdir(parents=True)
            for i in range(per_class):
                # Each class its own colour, plus noise: learnable in a few steps.
                pixels = (torch.rand(12, 12, 3, generator=g) * 64 + 160 * c).clamp(0, 255).to(torch.uint8)
                Image.fromarray(pixels.numpy()).save(root / split / f"class{c}" / f"{i}.png")


@pytest.mark.parametrize("model", ["torchvision:resnet18", "timm:resnet18"])
def test_an_image_folder_trains_a_library_model(model: str, tmp_path) -> None:
    pytest.importorskip("torchvision")
    pytest.importorskip(model.split(":")[0])
    _image_folder(tmp_path / "images")
    argv = ["--data", str(tmp_path / "images"), "--model", model, "--image-size", "16", "--batch-size", "4"]
    argv += [
        "--epochs",
        "2",
        "--no-progress",
        "--device",
        "cpu",
        "--blocks",
        "layer1",
        "layer2",
        "--checkpointing",
    ]
    assert main([*argv, "--out-dir", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 * 12 // 4 and summary["test_accuracy"] is None
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]["fc.weight"].shape[0] == 2


def _leg(samples_per_s: float, load: tuple[float, float] | None) -> dict:
    leg = {
        "test_accuracy": 0.9,
        "val_accuracy": 0.9,
        "train_loss": 0.1,
        "samples_per_s": samples_per_s,
        "peak_memory_mb": 100.0,
        "epochs": 1,
    }
    if load is not None:
        leg["load_avg"] = load
    return leg


def test_compare_table_flags_a_busy_machine() -> None:
    """--compare runs its legs one after the other: a competing job during one leg skews the ratio, so
    the table says so instead of printing a ratio that looks like ours."""
    from fastops.train.cli import busy_machine_note, compare_table

    quiet = {"fastops": _leg(1150, (0.3, 1.9)), "stock": _leg(1100, (1.9, 2.0))}
    busy = {"fastops": _leg(361, (0.5, 4.8)), "stock": _leg(1021, (4.8, 1.2))}
    assert busy_machine_note(quiet, cpus=2) is None
    note = busy_machine_note(busy, cpus=2)
    assert note is not None and "fastops 0.5 -> 4.8" in note and "not comparable" in note
    assert "not comparable" in compare_table(busy) or (os.cpu_count() or 1) >= 5
    assert busy_machine_note({"fastops": _leg(1, None), "stock": _leg(1, None)}, cpus=2) is None
