"""fastops.nn.SqueezeExcite on the real timm and torchvision SE classes: swap_modules reaches every SE
block of EfficientNet-B0 and MobileNetV3, keeps state_dict keys and Parameters, and the swapped
model's output and gradients match the stock model's. Skipped where timm / torchvision do not import."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fastops

try:
    import timm
    import torchvision
except Exception as exc:  # noqa: BLE001  (a torchvision built for another torch fails with RuntimeError)
    pytest.skip(f"timm / torchvision are not importable here: {exc}", allow_module_level=True)


def _models() -> dict[str, tuple[nn.Module, int]]:
    """name -> (a fresh random-init model, how many SE blocks it has)."""
    return {
        "timm-efficientnet_b0": (timm.create_model("efficientnet_b0", num_classes=10), 16),
        "timm-mobilenetv3_small_100": (timm.create_model("mobilenetv3_small_100", num_classes=10), 9),
        "torchvision-efficientnet_b0": (torchvision.models.efficientnet_b0(num_classes=10), 16),
        "torchvision-mobilenet_v3_small": (torchvision.models.mobilenet_v3_small(num_classes=10), 9),
    }


@pytest.mark.parametrize("name", list(_models()))
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_swap_reaches_every_se_block_and_matches_stock(name: str, layout: str) -> None:
    torch.manual_seed(0)
    stock, expected = _models()[name]
    swapped = copy.deepcopy(stock)
    keys = list(swapped.state_dict())
    report = fastops.swap_modules(swapped)
    se = [r for r in report.replaced if r.new_type == "fastops.nn.SqueezeExcite"]
    assert len(se) == expected, f"{name}: {report}"
    assert not [s for s in report.skipped if "SE" in s.reason], report
    assert list(swapped.state_dict()) == keys
    twin = se[0].new
    assert all(p is q for p, q in zip(twin.parameters(), se[0].old.parameters(), strict=True))

    # float64: train-mode BatchNorm over a batch of 2 amplifies float32 rounding past any fair
    # tolerance, in either model; in float64 the two must agree to rounding.
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    stock, swapped = stock.double().to(memory_format=fmt), swapped.double().to(memory_format=fmt)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64).contiguous(memory_format=fmt)
    outs, grads = [], []
    for model in (stock, swapped):
        model.train()
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout / stochastic-depth masks in both models
        out = model(x)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        outs.append(out.detach())
        grads.append([p.grad for p in model.parameters()])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-9, atol=1e-9)
    # aten's float64 hardsigmoid backward multiplies by a float32 1/6 (3e-8 relative off; ours is
    # exact), which train-mode BatchNorm amplifies on its way to the stem: hence 1e-5, not 1e-9.
    for g_swapped, g_stock in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(g_swapped, g_stock, rtol=1e-5, atol=1e-6)


def test_timm_se_module_and_unfusable_variants() -> None:
    from timm.layers.squeeze_excite import SEModule

    torch.manual_seed(0)
    plain = SEModule(32, rd_ratio=0.25)
    twin = fastops.nn.SqueezeExcite.from_torch(plain)
    assert twin.fc1.weight is plain.fc1.weight and list(twin.state_dict()) == list(plain.state_dict())
    x = torch.randn(2, 32, 5, 6)
    torch.testing.assert_close(twin(x), plain(x))
    with_bn = SEModule(32, norm_layer=nn.BatchNorm2d)
    maxpool = SEModule(32, add_maxpool=True)
    report = fastops.swap_modules(nn.Sequential(with_bn, maxpool))
    reasons = [s.reason for s in report.skipped]
    se = [r for r in report.replaced if r.new_type == "fastops.nn.SqueezeExcite"]  # the BN inside is swapped
    assert not se and "BatchNorm2d between fc1 and act" in reasons[0] and "add_maxpool" in reasons[1]
