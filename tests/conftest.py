"""Test-wide setup: deterministic seeds, true fp32 in cuDNN/cuBLAS, our kernels in module tests, a
kernel-choice cache of the run's own, and the `large` and `slow` markers."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

import fastops  # noqa: F401  (loads the kernels once, JIT-compiling in a source checkout)


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_tf32() -> Iterator[None]:
    # Every expected value that cuDNN or cuBLAS computes in fp32 must be true fp32: cuDNN convs default
    # to TF32 (10-bit mantissa), which would make an fp32 comparison measure TF32's error, not ours.
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.fixture(autouse=True, scope="session")
def _kernel_choice_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # Measured kernel choices go to a cache of the test run's own (subprocesses inherit it), never
    # to the user's ~/.cache/fastops.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FASTOPS_CACHE_DIR", str(tmp_path_factory.mktemp("fastops-cache")))
        yield


@pytest.fixture(autouse=True)
def _modules_run_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under backend "auto" a module may run torch's kernel where ours is measured slower; the tests
    # are about our kernels, so every module runs them (tests of the kernel choice unset this).
    monkeypatch.setenv("FASTOPS_BACKEND", "fastops")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    opt_in = {
        "large": ("FASTOPS_TEST_LARGE", "large-tensor test; set FASTOPS_TEST_LARGE=1 to run it"),
        "slow": ("FASTOPS_TEST_SLOW", "minutes on a CPU; set FASTOPS_TEST_SLOW=1 to run it"),
    }
    for marker, (variable, reason) in opt_in.items():
        if os.environ.get(variable) == "1":
            continue
        for item in items:
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_report_header(config: pytest.Config) -> list[str]:
    from fastops import _extension

    ext = _extension.load()
    return [
        f"fastops: {ext.mode} build, cpu={ext.cpu_capability}, cuda kernels={ext.with_cuda}, "
        f"torch {torch.__version__}, cuda available={torch.cuda.is_available()}"
    ]
