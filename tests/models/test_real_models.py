"""Real models nobody here wrote (timm, random init): swapped vs stock.

For MobileNetV3, EfficientNet and ConvNeXt, ``fastops.swap_modules`` must (1) replace what it
claims to (depthwise convs, GELUs), (2) give outputs and parameter gradients as close to the
float64 model as the stock model's are, in fp32 (TF32 off: tests/conftest.py) and under bf16 autocast (the 2x rule
on relative norms), and (3) train: 50 steps of FusedAdamW on the swapped model follow the stock
model with torch.optim.AdamW. Skipped where timm is not installed.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fastops
from tests.helpers import DEVICES

try:
    import timm
except Exception as exc:  # noqa: BLE001  (a torchvision built for another torch fails with RuntimeError)
    pytest.skip(f"timm is not importable here: {exc}", allow_module_level=True)

MODELS = ["mobilenetv3_large_100", "efficientnet_b0", "convnext_atto"]
# What each family must have swapped, at the least (a swap that silently stops reaching a family
# fails here rather than passing on an unchanged model); tests/models/test_swap_coverage.py checks
# every candidate. ConvNeXt's Mlp blocks (timm's GELU after a 1x1 conv) become GELUMlp.
EXPECTED_SWAPS = {
    "mobilenetv3_large_100": "DepthwiseConv2d",
    "efficientnet_b0": "DepthwiseConv2d",
    "convnext_atto": "GELUMlp",
}


def _sizes(device: str) -> tuple[int, int]:
    """(batch, image side): realistic on the GPU, small enough for two CPU cores."""
    return (8, 128) if device == "cuda" else (4, 64)


def _make(name: str, device: str) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    stock = timm.create_model(name, pretrained=False, num_classes=10).to(device)
    swapped = copy.deepcopy(stock)
    report = fastops.swap_modules(swapped)
    kinds = " ".join(report.counts())
    assert EXPECTED_SWAPS[name] in kinds, f"{name}: swap_modules replaced only {report.counts()}"
    return stock, swapped


def _forward_backward(model: nn.Module, x: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model(x)
    # A fixed random projection of the logits: every logit gets a gradient of its own.
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(out.device)
    (out.float() * weights).sum().backward()
    return out.detach().double(), [p.grad.detach().double() for p in model.parameters()]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).norm() / ref.norm().clamp_min(1e-30))


def _assert_2x(name: str, what: str, ours: float, stock: float, floor: float) -> None:
    assert ours <= 2.0 * max(stock, floor), (
        f"{name} {what}: swapped model's relative error {ours:.3e} > 2 x stock's {stock:.3e} "
        f"(floor {floor:.1e})"
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
def test_outputs_and_gradients_match_stock(name: str, device: str, autocast: bool) -> None:
    stock, swapped = _make(name, device)
    batch, side = _sizes(device)
    x = torch.randn(batch, 3, side, side, device=device).contiguous(memory_format=torch.channels_last)
    for model in (stock, swapped):
        model.to(memory_format=torch.channels_last).train()
    reference = copy.deepcopy(stock).double()
    ref_out, ref_grads = _forward_backward(reference, x.double(), autocast=False)
    stock_out, stock_grads = _forward_backward(stock, x, autocast)
    ours_out, ours_grads = _forward_backward(swapped, x, autocast)
    # One unit in the last place of the working precision: where stock is exact to it, ask no more.
    floor = 2**-8 if autocast else 2**-22
    _assert_2x(name, "output", _rel(ours_out, ref_out), _rel(stock_out, ref_out), floor)
    flat = lambda grads: torch.cat([g.reshape(-1) for g in grads])  # noqa: E731
    _assert_2x(name, "all gradients", _rel(flat(ours_grads), flat(ref_grads)),
               _rel(flat(stock_grads), flat(ref_grads)), floor)  # fmt: skip
    # Per tensor, looser (a single small tensor's error is noisy) but still tied to stock's.
    for (pname, _), ours, theirs, ref in zip(
        swapped.named_parameters(), ours_grads, stock_grads, ref_grads, strict=True
    ):
        if ref.norm() > 0:
            assert _rel(ours, ref) <= 4.0 * max(_rel(theirs, ref), floor), f"{name} grad of {pname}"


def _train(model: nn.Module, opt: torch.optim.Optimizer, data: list, steps: int) -> torch.Tensor:
    losses = []
    model.train()
    for step in range(steps):
        x, y = data[step % len(data)]
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses)


# 50 steps of a real model take minutes on two CPU cores (over 15 min for convnext_atto on a loaded
# machine), so the CPU case is `slow`: it runs with FASTOPS_TEST_SLOW=1; the GPU script runs the CUDA one.
@pytest.mark.parametrize(
    "device", [pytest.param(d, marks=pytest.mark.slow) if d == "cpu" else d for d in DEVICES]
)
@pytest.mark.parametrize("name", MODELS)
def test_fifty_steps_follow_stock_loss_curve(name: str, device: str) -> None:
    """50 AdamW steps: the swapped model with FusedAdamW stays as close to stock as stock stays to
    itself when its starting weights move by one part in 10^6 (training amplifies rounding noise, so
    "follows" is measured against that noise, not against zero)."""
    stock, swapped = _make(name, device)
    jittered = copy.deepcopy(stock)
    with torch.no_grad():
        for p in jittered.parameters():
            p.mul_(1 + 1e-6 * torch.randn_like(p))
    batch, side = _sizes(device)
    gen = torch.Generator().manual_seed(1)
    data = [
        (
            torch.randn(2 * batch, 3, side, side, generator=gen),
            torch.randint(0, 10, (2 * batch,), generator=gen),
        )
        for _ in range(4)
    ]
    data = [(x.to(device).contiguous(memory_format=torch.channels_last), y.to(device)) for x, y in data]
    hyper = dict(lr=3e-4, weight_decay=0.05)
    stock_curve = _train(stock, torch.optim.AdamW(stock.parameters(), **hyper), data, 50)
    noise_curve = _train(jittered, torch.optim.AdamW(jittered.parameters(), **hyper), data, 50)
    ours = _train(swapped, fastops.optim.FusedAdamW(swapped.parameters(), **hyper), data, 50)
    assert torch.isfinite(ours).all(), f"{name}: non-finite loss {ours.tolist()}"
    gap = (ours - stock_curve).abs().mean().item()
    noise = (noise_curve - stock_curve).abs().mean().item()
    assert gap <= 2.0 * noise + 0.01 * stock_curve.abs().mean().item(), (
        f"{name}: mean |fastops - stock| loss gap {gap:.4f} over 50 steps vs {noise:.4f} for stock "
        f"against itself with jittered weights\nfastops {ours.tolist()}\nstock {stock_curve.tolist()}"
    )
    assert ours[-4:].mean() < ours[:4].mean(), f"{name}: the swapped model did not learn: {ours.tolist()}"
