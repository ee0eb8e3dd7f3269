"""The training tests run tiny models: one intra-op thread each. Intra-op parallelism buys nothing at
these sizes, and on a small machine shared with other jobs OpenMP threads that wait for each other
at every barrier slow a step down many times over. Spawned processes (--compare legs, torchrun
ranks) inherit the limit through OMP_NUM_THREADS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    before = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
