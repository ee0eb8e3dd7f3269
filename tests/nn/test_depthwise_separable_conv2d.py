"""fastops.nn.DepthwiseSeparableConv2d: interchange with the nn.Conv2d pair (state dicts both ways,
from_torch sharing parameters)."""

from __future__ import annotations

import pytest
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


def test_module_runs_fused_for_channels_last_inference(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastops.nn.depthwise_separable_conv2d as mod

    calls = []
    fused = mod.depthwise_separable_conv2d
    monkeypatch.setattr(mod, "depthwise_separable_conv2d", lambda *a: calls.append(1) or fused(*a))
    seq = torch.nn.Sequential(
        torch.nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16), torch.nn.Conv2d(16, 24, 1)
    )
    ours = fastops.nn.DepthwiseSeparableConv2d.from_torch(seq)
    fresh = fastops.nn.DepthwiseSeparableConv2d(16, 24, 3, stride=2, padding=1)
    assert fresh.state_dict().keys() == ours.state_dict().keys()  # keys unchanged by the fused path
    fresh.load_state_dict(seq.state_dict())
    x = torch.randn(2, 16, 11, 10).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        want = seq(x)
        for m in (ours, fresh):
            y = m(x)
            torch.testing.assert_close(y, want)
            assert y.is_contiguous(memory_format=torch.channels_last)
        assert len(calls) == 2
        ours(x.contiguous())  # NCHW: the unfused pair
        handle = ours.pointwise.register_forward_hook(lambda *a: None)
        ours(x)  # a hook on the 1x1 must still run: unfused
        handle.remove()
        assert len(calls) == 2
        ours(x)
        assert len(calls) == 3
    # Recording autograd: the unfused pair (the fused backward's recompute is slower), same results.
    xg = x.clone().requires_grad_(True)
    y, y_ref = ours(xg), seq(xg)
    assert len(calls) == 3
    torch.testing.assert_close(y, y_ref)
    got = torch.autograd.grad(y.square().sum(), [xg, *ours.parameters()])
    want_g = torch.autograd.grad(y_ref.square().sum(), [xg, *seq.parameters()])
    for a, b in zip(got, want_g, strict=True):
        torch.testing.assert_close(a, b)
