"""The test suite turns torch's "autograd kernel was not registered" warning into an error (see
pyproject.toml), so an op that silently lacks a backward fails loudly. This checks the filter bites."""

from __future__ import annotations

import pytest
import torch

_lib = torch.library.Library("fastops_selftest", "DEF")
_lib.define("no_autograd(Tensor x) -> Tensor")
_lib.impl("no_autograd", lambda x: x * 2, "CPU")


def test_missing_autograd_kernel_fails_the_test() -> None:
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(UserWarning, match="autograd kernel was not registered"):
        torch.ops.fastops_selftest.no_autograd(x).sum().backward()
