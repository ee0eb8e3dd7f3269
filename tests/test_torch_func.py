"""torch.func transforms on a swapped model: grad, vjp, jacrev and per-sample gradients
(vmap(grad(functional_call))) equal the stock model's; outside a transform the kernels still run."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, jacrev, jvp, vjp, vmap

import fastops


class _SE(nn.Module):
    """A plain squeeze-excitation block (swapped to fastops.nn.SqueezeExcite)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(channels, 3)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(3, channels)
        self.gate = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(x.mean((2, 3))))))[:, :, None, None]


def _models() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    stock = nn.Sequential(
        nn.Conv2d(3, 6, 1),
        nn.BatchNorm2d(6),
        nn.GELU(),
        nn.Conv2d(6, 6, 3, padding=1, groups=6),
        _SE(6),
        nn.Flatten(),
        nn.Sequential(nn.Linear(6 * 5 * 5, 8), nn.GELU()),
        nn.Linear(8, 3),
    ).double()
    stock.eval()  # batch norm on its running statistics: per-sample gradients need that in stock too
    ours = copy.deepcopy(stock)
    report = fastops.swap_modules(ours)
    assert len(report) == 6 and not report.skipped  # BN, GELU, depthwise, SE, Linear->GELU (2)
    for m in ours.modules():
        if hasattr(m, "backend"):
            m.backend = "fastops"  # our ops, wherever the policy would send these inputs
    return stock, ours


def _loss(model: nn.Module, params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    batched = x.dim() == 4
    out = functional_call(model, params, (x if batched else x[None],))
    return nn.functional.cross_entropy(out, y if batched else y[None])


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


def test_torch_func_transforms_equal_stock() -> None:
    """They failed with "cannot use C++ torch::autograd::Function with functorch transforms"."""
    stock, ours = _models()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 5, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (4,), generator=gen)
    results = []
    for model in (stock, ours):
        params = _params(model)
        per_sample = vmap(grad(lambda p, xi, yi, m=model: _loss(m, p, xi, yi)), in_dims=(None, 0, 0))
        out, pullback = vjp(model, x)
        results.append(
            {
                "grad": grad(lambda p, m=model: _loss(m, p, x, y))(params),
                "per_sample": per_sample(params, x, y),
                "vjp": pullback(torch.ones_like(out)),
                "jacrev": jacrev(model)(x[:1]),
                "jvp": jvp(model, (x,), (torch.ones_like(x),)),
            }
        )
    want, got = results
    assert want["per_sample"]["0.weight"].shape == (4, 6, 3, 1, 1)
    torch.testing.assert_close(got, want)


def test_outside_a_transform_the_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The functorch check costs the eager call a C flag; the references are not reached there."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a reference ran outside torch.func")

    for name in ("gelu", "bias_gelu", "batch_norm", "depthwise_conv2d", "squeeze_excite"):
        monkeypatch.setattr(fastops.reference, name, refuse)
    _, ours = _models()
    x = torch.randn(2, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    ours(x).sum().backward()
    torch.compile(ours, fullgraph=True)(x.detach())


def test_clipped_log_and_the_fused_separable_conv_under_vmap() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(3, 7, generator=gen, dtype=torch.float64) - 0.2  # some below eps
    per_row = vmap(grad(lambda row: fastops.clipped_log(row, 1e-3).sum()))(x)
    torch.testing.assert_close(per_row, 1 / x.clamp(min=1e-3))  # the straight-through gradient
    dw, pw = torch.randn(4, 1, 3, 3, dtype=torch.float64), torch.randn(5, 4, 1, 1, dtype=torch.float64)
    xs = torch.randn(2, 3, 4, 6, 6, dtype=torch.float64)
    got = vmap(lambda xi: fastops.depthwise_separable_conv2d(xi, dw, None, pw, None, padding=1))(xs)
    want = torch.stack(
        [fastops.reference.depthwise_separable_conv2d(xi, dw, None, pw, None, 1, 1, 1) for xi in xs]
    )
    torch.testing.assert_close(got, want)
