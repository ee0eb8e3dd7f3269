"""Loading, building and reporting: the JIT path, fastops.info, and the build's error messages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastops import _build, _extension

REPO = Path(__file__).resolve().parent.parent


def _run(
    code: list[str], env: dict[str, str] | None = None, timeout: int = 900
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, *code], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def test_info_cli_reports_build_and_ops() -> None:
    proc = _run(["-m", "fastops.info"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "build: " in out and "torch " + torch.__version__ in out
    assert ("CUDA kernels: compiled in" in out) == _extension.load().with_cuda
    assert "clipped_log " in out.replace("clipped_log_backward", "")
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("clipped_log "))
    assert "cpu" in line


def test_jit_build_from_source_tree() -> None:
    """FASTOPS_JIT=1 compiles csrc/ with ninja (or reuses the cache) and the ops then run."""
    loaded = _extension.load()
    cache = os.environ.get("TORCH_EXTENSIONS_DIR") if loaded.mode == "jit" else None
    cache = cache or str(REPO / "build" / "jit-test-cache")
    code = (
        "import torch, fastops; from fastops import _extension; e = _extension.load(); "
        "assert e.mode == 'jit', e; x = torch.rand(100) + 0.5; "
        "torch.testing.assert_close(fastops.clipped_log(x), torch.log(x)); print('jit ok', e.path)"
    )
    proc = _run(["-c", code], env={"FASTOPS_JIT": "1", "TORCH_EXTENSIONS_DIR": cache})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "jit ok" in proc.stdout
    assert cache in proc.stdout  # the cache directory is the one TORCH_EXTENSIONS_DIR names


def test_jit_without_compiler_says_what_to_install(tmp_path: Path) -> None:
    proc = _run(
        ["-c", "import fastops"],
        env={"FASTOPS_JIT": "1", "CXX": "/nonexistent/c++", "TORCH_EXTENSIONS_DIR": str(tmp_path)},
        timeout=300,
    )
    assert proc.returncode != 0
    assert "no C++ compiler" in proc.stderr and "apt-get install g++" in proc.stderr


def test_setup_without_torch_fails_fast_with_advice() -> None:
    """What a plain (isolated) `pip install .` runs into: no torch in the build environment."""
    code = (
        "import runpy, sys; sys.modules['torch'] = None; sys.argv = ['setup.py', '--version']; "
        "runpy.run_path('setup.py', run_name='__main__')"
    )
    proc = _run(["-c", code], timeout=120)
    assert proc.returncode != 0
    assert "--no-build-isolation" in proc.stderr


@pytest.mark.parametrize("value", ["2", "yes"])
def test_bad_fastops_cuda_value(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("FASTOPS_CUDA", value)
    with pytest.raises(ValueError, match="FASTOPS_CUDA"):
        _build.want_cuda("13.0")


def test_forcing_cuda_on_cpu_torch_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTOPS_CUDA", "1")
    with pytest.raises(RuntimeError, match="torch is a CPU-only build"):
        _build.want_cuda(None)


def test_bad_cpu_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTOPS_CPU_CAPABILITY", "sse9")
    with pytest.raises(ValueError, match="FASTOPS_CPU_CAPABILITY"):
        _build.cpu_capability()


def test_cpu_isa_mismatch_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_build, "cpu_flags", lambda: {"sse2", "avx"})
    with pytest.raises(RuntimeError, match="lacks .*FASTOPS_CPU_CAPABILITY=avx2"):
        _extension._check_cpu_supports("avx512", "fastops._C")


def test_default_max_jobs_is_bounded() -> None:
    jobs = _build.default_max_jobs()
    assert 1 <= jobs <= (os.cpu_count() or 1)
