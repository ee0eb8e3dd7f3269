"""benchmarks/bench_models.py without timm/torchvision, and how its result file is summarized."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks import bench_models, render_readme


def test_skips_cleanly_without_timm_and_torchvision(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A None entry in sys.modules makes `import timm` raise ImportError, installed or not.
    monkeypatch.setitem(sys.modules, "timm", None)
    monkeypatch.setitem(sys.modules, "torchvision", None)
    bench_models.main(["--device", "cpu", "--check", "--out", str(tmp_path)])  # returns: exit status 0
    assert "skipped: neither timm nor torchvision" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_readme_headline_compares_compiled_with_compiled(tmp_path: Path) -> None:
    path = tmp_path / "models_cpu.csv"
    rows = [("stock", 100.0), ("fastops", 80.0), ("stock_compile", 60.0), ("fastops_compile", 50.0)]
    path.write_text(
        "# device: CPU, 2 cores\n# torch: 2.14.1\n# date: 2026-11-25 16:00 UTC\n"
        "op,case,direction,dtype,size,provider,median_ms,p20_ms,p80_ms,bytes,gbps,roofline_pct\n"
        + "".join(f"models,m,step,float32,b,{p},{ms},{ms},{ms},0,0,0\n" for p, ms in rows)
    )
    line = render_readme.headline(path)
    assert "speedup of fastops over stock 1.25x, fastops_compile over stock_compile 1.20x" in line
    assert "copy roofline" not in line  # a training step has no byte model
