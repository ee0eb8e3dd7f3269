"""fastops.policy: the module side of the kernel choice: both paths of every module compute the same
thing, and a swapped model counts what ran PyTorch's kernel. The choice itself: tests/test_tuner.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fastops
from fastops import policy, tuner
from fastops.nn.gelu import GELU, LinearGELU
from fastops.nn.squeeze_excite import SqueezeExcite


@pytest.fixture
def auto(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """The kernel choice as users get it (conftest makes every module run ours), counters reset."""
    monkeypatch.delenv(policy.BACKEND_ENV, raising=False)
    monkeypatch.setenv(tuner.CACHE_ENV, str(tmp_path))
    tuner.clear_memory()
    policy.reset_fallback_counts()
    yield
    tuner.clear_memory()
    policy.reset_fallback_counts()


@pytest.mark.parametrize("conv", [False, True])
def test_squeeze_excite_torch_path_is_the_stock_block(auto: None, conv: bool) -> None:
    torch.manual_seed(0)
    m = SqueezeExcite(8, 4, act="silu", gate="hardsigmoid", conv=conv)
    x = torch.randn(2, 8, 5, 5, requires_grad=True)
    m.backend = "fastops"
    ours = m(x)
    m.backend = "torch"
    stock = m(x)
    torch.testing.assert_close(stock, ours, rtol=1e-5, atol=1e-6)
    (g_stock,) = torch.autograd.grad(stock.sum(), x)
    (g_ours,) = torch.autograd.grad(ours.sum(), x)
    torch.testing.assert_close(g_stock, g_ours, rtol=1e-5, atol=1e-6)


def test_gelu_modules_torch_path(auto: None) -> None:
    x = torch.randn(3, 16)
    g = GELU(approximate="tanh")
    g.backend = "torch"
    assert torch.equal(g(x), F.gelu(x, approximate="tanh"))
    lin = LinearGELU(16, 8)
    lin.backend = "torch"
    assert torch.equal(lin(x), F.gelu(F.linear(x, lin.weight, lin.bias)))


def test_swapped_model_counts_what_ran_pytorch(auto: None) -> None:
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.GELU())
    fastops.swap_modules(model)
    times = {"fastops": 2.0, "torch": 1.0}  # PyTorch's measured faster for both modules
    with tuner.use_timer(lambda path, fn, reps: (fn(), times[path])[1]), torch.no_grad():
        model(torch.randn(1, 4, 6, 6))
        model(torch.randn(1, 4, 6, 6))
    assert policy.fallback_counts() == {"depthwise_conv2d": 2, "gelu": 2}


def test_separable_module_fuses_only_where_the_choice_says(
    auto: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fastops.nn.depthwise_separable_conv2d as mod

    calls: list[int] = []
    fused = mod.depthwise_separable_conv2d
    monkeypatch.setattr(mod, "depthwise_separable_conv2d", lambda *a: calls.append(1) or fused(*a))
    x = torch.randn(2, 16, 12, 12).contiguous(memory_format=torch.channels_last)
    for fused_faster in (True, False):
        tuner.clear_memory()
        shutil.rmtree(tuner.cache_dir(), ignore_errors=True)  # measure again, not the last loop's choice
        m = fastops.nn.DepthwiseSeparableConv2d(16, 24, 3, padding=1).eval()
        m.backend = "torch"  # the pair, unfused, as the reference
        with torch.no_grad():
            want = m(x)
            m.backend = "auto"
            times = {"fastops": 1.0 if fused_faster else 3.0, "torch": 2.0}
            with tuner.use_timer(lambda path, fn, reps, times=times: (fn(), times[path])[1]):
                m(x)  # tuned: both paths ran
            before = len(calls)
            torch.testing.assert_close(m(x), want)
        assert (len(calls) > before) == fused_faster
    m.train()
    before = len(calls)
    m(x)  # autograd records: the pair, never the fused op
    assert len(calls) == before


@pytest.mark.parametrize("straight_through", [True, False])
def test_clipped_log_torch_path_matches_ours(straight_through: bool) -> None:
    """The fallback (PyTorch's clamp and log) gives the values and gradients of our kernel, the
    straight-through gradient grad / clamp(x, eps) included."""
    x = torch.cat([torch.rand(300) * 4, torch.tensor([0.0, -1.0, 1e-9, float("nan"), float("inf")])])
    outputs = {}
    for backend in ("fastops", "torch"):
        m = fastops.nn.ClippedLog(eps=1e-6, straight_through=straight_through)
        m.backend = backend
        xg = x.clone().requires_grad_(True)
        y = m(xg)
        (grad,) = torch.autograd.grad(y, xg, torch.linspace(-1, 1, x.numel()))
        outputs[backend] = (y.detach(), grad)
    for a, b in zip(outputs["fastops"], outputs["torch"], strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)
