"""Test-wide setup: deterministic seeds and the device list (cpu always, cuda when present)."""

from __future__ import annotations

import pytest
import torch

import fastops  # noqa: F401  (loads the kernels once, JIT-compiling in a source checkout)


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _cuda_depthwise_runs_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    # fastops.nn.DepthwiseConv2d falls back to cuDNN on CUDA by default; the tests are about our
    # kernels, so every module test runs them (tests of the default itself unset this).
    monkeypatch.setenv("FASTOPS_CUDA_DEPTHWISE", "fastops")


def pytest_report_header(config: pytest.Config) -> list[str]:
    from fastops import _extension

    ext = _extension.load()
    return [
        f"fastops: {ext.mode} build, cpu={ext.cpu_capability}, cuda kernels={ext.with_cuda}, "
        f"torch {torch.__version__}, cuda available={torch.cuda.is_available()}"
    ]
