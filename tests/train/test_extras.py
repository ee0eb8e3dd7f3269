"""Optional dependencies: a missing one the run needs is an error before training, naming what to
install; a missing one that only decorates the run (plots, TensorBoard, progress bar) is skipped
with a one-line notice. A missing module is simulated with sys.modules[name] = None."""

from __future__ import annotations

import json
import sys

import pytest

from fastops.train.cli import main
from tests.train.test_cli import TINY


def test_without_matplotlib_and_tqdm_the_run_ends_with_a_notice_and_no_plot(
    tmp_path, monkeypatch, capsys
) -> None:
    for name in ("matplotlib", "matplotlib.pyplot", "tqdm", "tqdm.auto"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main([*TINY, "--progress", "--out-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "matplotlib is not installed, so no curves.png is drawn (pip install fastops[train])" in err
    assert "tqdm is not installed, so there is no progress bar" in err
    assert err.count("matplotlib is not installed") == 1
    assert json.loads((tmp_path / "summary.json").read_text())["epochs"] == 1
    assert not (tmp_path / "curves.png").exists() and (tmp_path / "metrics.csv").is_file()


def test_without_tensorboard_there_are_no_events_and_a_notice(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    assert main([*TINY, "--out-dir", str(tmp_path)]) == 0
    assert "tensorboard is not installed, so no TensorBoard events are written" in capsys.readouterr().err
    assert not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        (
            "sklearn",
            [],
            "--data digits needs scikit-learn, which is not installed: pip install fastops[train]",
        ),
        (
            "timm",
            ["--model", "timm:resnet18", "--data", "synthetic"],
            "--model timm:resnet18 needs timm, which is not installed: pip install timm",
        ),
        ("torchvision", ["--model", "torchvision:resnet18", "--data", "synthetic"], "needs torchvision"),
    ],
)
def test_a_missing_dependency_the_run_needs_fails_before_training(
    module, argv, message, tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(SystemExit) as e:
        main([*TINY, *argv, "--out-dir", str(tmp_path / "run")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_an_image_folder_without_torchvision_names_it(tmp_path, monkeypatch, capsys) -> None:
    for split in ("train/a", "train/b", "val/a", "val/b"):
        (tmp_path / "images" / split).mkdir(parents=True)
    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(SystemExit):
        main([*TINY, "--data", str(tmp_path / "images"), "--out-dir", str(tmp_path / "run")])
    assert (
        "(an ImageFolder directory) needs torchvision, which is not installed: pip install torchvision"
        in capsys.readouterr().err
    )
