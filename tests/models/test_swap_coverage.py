"""swap_modules on real timm / torchvision models (random init, fp32, batch 2, small inputs): what
it must reach in each (timm's GELU and Mlp blocks, Conv2dSame, torchvision's Linear -> GELU), that
every candidate is either replaced or reported with its reason, that outputs and gradients match
the stock model, and that undo restores it. Skipped where timm / torchvision are not importable
(`make test-models` runs them in an env where they are)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import nn

import fastops
from fastops.swap import SwapReport
from fastops.swap_rules import class_path

torchvision = pytest.importorskip("torchvision")
timm = pytest.importorskip("timm")

_TIMM_GELUS = {"timm.layers.activations.GELU", "timm.layers.activations.GELUTanh"}
_MLP_CHILDREN = {"fc1", "act", "drop1", "norm", "fc2", "drop2"}
_BN_ACT = "timm.layers.norm_act.BatchNormAct2d -> fastops.nn.BatchNormAct2d"


def _is_candidate(m: nn.Module) -> bool:
    """What a user would expect the swap to consider, decided here independently of its rules."""
    is_conv = isinstance(m, nn.Conv2d) and m.groups == m.in_channels == m.out_channels
    is_mlp = {name for name, _ in m.named_children()} == _MLP_CHILDREN
    is_bn = isinstance(m, nn.BatchNorm2d)  # nn.BatchNorm2d and timm's BatchNormAct2d
    return isinstance(m, nn.GELU) or class_path(type(m)) in _TIMM_GELUS or is_conv or is_mlp or is_bn


# name -> (constructor, input side, {"old -> new": the least count that must be replaced})
MODELS: dict[str, tuple[Callable[[], nn.Module], int, dict[str, int]]] = {
    "timm_mobilenetv3_small_100": (
        lambda: timm.create_model("mobilenetv3_small_100", num_classes=10),
        64,
        {"nn.Conv2d -> fastops.nn.DepthwiseConv2d": 11, _BN_ACT: 34},
    ),
    "timm_efficientnet_b0": (
        lambda: timm.create_model("efficientnet_b0", num_classes=10),
        64,
        {"nn.Conv2d -> fastops.nn.DepthwiseConv2d": 16, _BN_ACT: 49},
    ),
    "timm_tf_efficientnet_b0": (  # odd side: TF "same" pads asymmetrically
        lambda: timm.create_model("tf_efficientnet_b0", num_classes=10),
        65,
        {
            "timm.layers.conv2d_same.Conv2dSame -> fastops.nn.DepthwiseConv2dSame": 4,
            "nn.Conv2d -> fastops.nn.DepthwiseConv2d": 12,
            _BN_ACT: 49,
        },
    ),
    "timm_convnext_atto": (
        lambda: timm.create_model("convnext_atto", num_classes=10),
        64,
        {
            "timm.layers.mlp.Mlp -> fastops.nn.GELUMlp": 12,
            "nn.Conv2d -> fastops.nn.DepthwiseConv2d": 12,
        },
    ),
    "timm_vit_tiny_patch16_224": (
        lambda: timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=32),
        32,
        {"timm.layers.mlp.Mlp -> fastops.nn.GELUMlp": 12},
    ),
    "torchvision_mobilenet_v2": (
        lambda: torchvision.models.mobilenet_v2(num_classes=10),
        64,
        {"nn.Conv2d -> fastops.nn.DepthwiseConv2d": 17, "nn.BatchNorm2d -> fastops.nn.BatchNorm2d": 52},
    ),
    "torchvision_efficientnet_b0": (
        lambda: torchvision.models.efficientnet_b0(num_classes=10),
        64,
        {"nn.Conv2d -> fastops.nn.DepthwiseConv2d": 16, "nn.BatchNorm2d -> fastops.nn.BatchNorm2d": 49},
    ),
    "torchvision_convnext_tiny": (
        lambda: torchvision.models.convnext_tiny(num_classes=10),
        32,
        {"nn.Linear -> fastops.nn.LinearGELU": 18, "nn.Conv2d -> fastops.nn.DepthwiseConv2d": 18},
    ),
}


def _outputs_and_grads(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    torch.manual_seed(2)  # the same dropout and stochastic-depth draws for stock and swapped
    out = model(x)
    # A fixed random projection of the logits: every logit gets a gradient of its own.
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    (out * weights).sum().backward()
    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    return out.detach(), torch.cat(grads)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).norm() / ref.norm().clamp_min(1e-30))


def _uncovered(model: nn.Module, report: SwapReport) -> list[str]:
    """Candidates neither replaced, nor inside a replaced module, nor reported as skipped."""
    replaced = {r.name for r in report.replaced}
    skipped = {s.name for s in report.skipped}
    return [
        name
        for name, m in model.named_modules()
        if _is_candidate(m)
        and name not in replaced | skipped
        and not any(name.startswith(r + ".") for r in replaced)
    ]


@pytest.mark.parametrize("name", list(MODELS))
def test_swap_reaches_every_candidate_and_matches_stock(name: str) -> None:
    build, side, least = MODELS[name]
    torch.manual_seed(0)
    stock = build().train()
    model = copy.deepcopy(stock)
    types = {n: type(m) for n, m in model.named_modules()}
    keys = list(model.state_dict())
    x = torch.randn(2, 3, side, side, generator=torch.Generator().manual_seed(1))

    report = fastops.swap_modules(model)
    counts = report.counts()
    for kind, n in least.items():
        assert counts.get(kind, 0) >= n, f"{name}: expected >= {n} x {kind}, got {counts}\n{report}"
    assert not _uncovered(stock, report), f"{name}: silent candidates {_uncovered(stock, report)}\n{report}"
    assert list(model.state_dict()) == keys

    # float64: train-mode BatchNorm over a batch of 2 amplifies float32 rounding past any fair
    # tolerance once the two models' BatchNorms differ in their last bits (ours is swapped in too).
    stock, model, x = stock.double(), model.double(), x.double()
    stock_out, stock_grads = _outputs_and_grads(stock, x)
    out, grads = _outputs_and_grads(model, x)
    assert _rel(out, stock_out) < 1e-4, f"{name}: output differs by {_rel(out, stock_out):.2e}"
    assert _rel(grads, stock_grads) < 1e-3, f"{name}: gradients differ by {_rel(grads, stock_grads):.2e}"

    report.undo()
    assert {n: type(m) for n, m in model.named_modules()} == types
    undone_out, _ = _outputs_and_grads(model, x)
    torch.testing.assert_close(undone_out, stock_out, rtol=0, atol=0)
