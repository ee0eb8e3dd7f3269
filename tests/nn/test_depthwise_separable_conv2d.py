"""fastops.nn.DepthwiseSeparableConv2d: interchange with the nn.Conv2d pair (state dicts both ways,
from_torch sharing parameters)."""

from __future__ import annotations

import torch
from torch import nn

import fastops
from tests.helpers import devices


@devices
def test_separable_module_interchanges_with_sequential(device: str) -> None:
    seq = nn.Sequential(
        nn.Conv2d(16, 16, 3, stride=1, padding=1, groups=16, device=device),
        nn.Conv2d(16, 24, 1, device=device),
    )
    ours = fastops.nn.DepthwiseSeparableConv2d(16, 24, 3, padding=1, device=device)
    assert {k.split(".", 1)[1] for k in ours.state_dict()} == {k.split(".", 1)[1] for k in seq.state_dict()}
    ours.load_state_dict(seq.state_dict())  # "0.*" / "1.*" keys
    x = torch.randn(2, 16, 9, 9, device=device).contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    y, y_ref = ours(x), seq(x)
    torch.testing.assert_close(y, y_ref)
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    (gx_ref,) = torch.autograd.grad(y_ref.square().sum(), x)
    torch.testing.assert_close(gx, gx_ref)

    # and back: our keys into a module with depthwise/pointwise children, and from_torch sharing params
    class Seed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16, device=device)
            self.pointwise = nn.Conv2d(16, 24, 1, device=device)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.pointwise(self.depthwise(t))

    seed = Seed()
    seed.load_state_dict(ours.state_dict())
    torch.testing.assert_close(seed(x), y)
    shared = fastops.nn.DepthwiseSeparableConv2d.from_torch(seq)
    assert shared.depthwise.weight is seq[0].weight and shared.pointwise is seq[1]
    torch.testing.assert_close(shared(x), y_ref)
