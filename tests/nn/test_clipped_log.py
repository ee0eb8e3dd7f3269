"""fastops.nn.ClippedLog: the module against the op, and its argument errors."""

from __future__ import annotations

import pytest
import torch

import fastops
from tests.helpers import devices


@devices
def test_module(device: str) -> None:
    m = fastops.nn.ClippedLog(eps=1e-4, straight_through=False)
    assert "eps=0.0001" in repr(m)
    x = torch.rand(4, 5, device=device)
    torch.testing.assert_close(m(x), fastops.clipped_log(x, 1e-4, False))
    with pytest.raises(ValueError, match=r"nn\.ClippedLog.*eps"):
        fastops.nn.ClippedLog(eps=0.0)
