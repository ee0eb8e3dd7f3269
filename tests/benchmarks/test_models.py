"""benchmarks/bench_models.py without timm/torchvision, and how its result file is summarized."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks import bench_models, common, render_readme


def test_skips_cleanly_without_timm_and_torchvision(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A None entry in sys.modules makes `import timm` raise ImportError, installed or not.
    monkeypatch.setitem(sys.modules, "timm", None)
    monkeypatch.setitem(sys.modules, "torchvision", None)
    bench_models.main(["--device", "cpu", "--check", "--out", str(tmp_path)])  # returns: exit status 0
    assert "skipped: neither timm nor torchvision" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_summary_compares_compiled_with_compiled() -> None:
    rows = [("stock", 100.0), ("fastops", 80.0), ("stock_compile", 60.0), ("fastops_compile", 50.0)]
    results = [
        common.Result("models", "m", "step", "float32", "b", p, ms, ms, ms, 0, 0.0, 0.0) for p, ms in rows
    ]
    facts = {k: "" for k in common.COLUMNS}
    line = render_readme.summary(common.long_rows(results, facts, 0.0))
    assert "speedup of fastops over stock 1.25x, fastops_compile over stock_compile 1.20x" in line
    assert "copy roofline" not in line  # a training step has no byte model
