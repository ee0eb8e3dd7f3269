"""fastops.policy: modules run torch's kernel in a measured slower region, and only there."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fastops
from fastops import policy
from fastops.nn.depthwise_conv2d import DepthwiseConv2d
from fastops.nn.gelu import GELU, LinearGELU
from fastops.nn.squeeze_excite import SqueezeExcite

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def auto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The policy as users get it (conftest makes every module run ours), counters reset."""
    monkeypatch.delenv(policy.BACKEND_ENV, raising=False)
    policy.reset_fallback_counts()
    yield
    policy.reset_fallback_counts()


@pytest.fixture
def region(monkeypatch: pytest.MonkeyPatch) -> None:
    """No region but those the test registers, for the test only."""
    monkeypatch.setattr(policy, "_REGIONS", [])


def _small_map_region(**narrow: object) -> policy.SlowerRegion:
    return policy.SlowerRegion(
        op="depthwise_conv2d",
        device="cpu",
        what="test: maps up to 8x8",
        evidence="test",
        when=lambda case: case.shape[2] * case.shape[3] <= 64,
        **narrow,  # type: ignore[arg-type]
    )


def _spy_on_ours(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records each call of the fastops depthwise op the module makes."""
    calls: list[str] = []
    import fastops.nn.depthwise_conv2d as module

    real = module.depthwise_conv2d

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append("fastops")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "depthwise_conv2d", spy)
    return calls


def test_module_runs_torch_only_inside_a_region(
    auto: None, region: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy.register_slower_region(_small_map_region())
    ours = _spy_on_ours(monkeypatch)
    m = DepthwiseConv2d(4, 3, padding=1)
    small, large = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 9, 9)
    torch.testing.assert_close(m(small), F.conv2d(small, m.weight, m.bias, 1, 1, 1, 4))
    assert ours == [] and policy.fallback_counts()["depthwise_conv2d"] == 1
    m(large)
    assert ours == ["fastops"] and policy.fallback_counts()["depthwise_conv2d"] == 1


def test_repeated_calls_reuse_the_decision_and_still_count(
    auto: None, region: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = _spy_on_ours(monkeypatch)
    m = DepthwiseConv2d(4, 3, padding=1)
    small = torch.randn(2, 4, 8, 8)
    m(small)
    m(small)
    assert ours == ["fastops", "fastops"]
    policy.register_slower_region(_small_map_region())  # a new region: decided again, not remembered
    m(small)
    m(small)
    assert ours == ["fastops", "fastops"] and policy.fallback_counts()["depthwise_conv2d"] == 2


def test_a_detail_that_cannot_be_hashed_is_decided_and_counted_every_call(auto: None, region: None) -> None:
    policy.register_slower_region(_small_map_region())
    m = DepthwiseConv2d(4, 3, padding=1)
    x = torch.randn(2, 4, 8, 8)
    for _ in range(2):
        assert policy.runs_torch(m, "depthwise_conv2d", x, unhashable=[1, 2])
    assert policy.fallback_counts()["depthwise_conv2d"] == 2


def test_region_narrows_by_layout_dtype_and_training(
    auto: None, region: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy.register_slower_region(
        _small_map_region(channels_last=True, dtypes=(torch.float32,), backward=False)
    )
    ours = _spy_on_ours(monkeypatch)
    m = DepthwiseConv2d(4, 3, padding=1)
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        m(x)  # NCHW: not in the region
    x_cl = x.contiguous(memory_format=torch.channels_last)
    m(x_cl)  # a backward follows (the weight needs a gradient): training, not in the region
    assert ours == ["fastops", "fastops"]
    with torch.no_grad():
        m(x_cl)
    assert len(ours) == 2 and policy.fallback_counts()["depthwise_conv2d"] == 1
    m.requires_grad_(False)
    m(x_cl)  # nothing needs a gradient: inference
    assert len(ours) == 2 and policy.fallback_counts()["depthwise_conv2d"] == 2
    bf16 = policy.Case("depthwise_conv2d", "cpu", "avx512", True, torch.bfloat16, (1, 4, 8, 8), False)
    assert not policy.regions("depthwise_conv2d")[-1].covers(bf16)


def test_backend_overrides(auto: None, region: None, monkeypatch: pytest.MonkeyPatch) -> None:
    policy.register_slower_region(_small_map_region())
    ours = _spy_on_ours(monkeypatch)
    m = DepthwiseConv2d(4, 3, padding=1)
    small, large = torch.randn(1, 4, 8, 8), torch.randn(1, 4, 16, 16)
    m.backend = "fastops"
    m(small)
    assert ours == ["fastops"]
    m.backend = "torch"
    m(large)
    assert ours == ["fastops"]
    m.backend = "auto"
    monkeypatch.setenv(policy.BACKEND_ENV, "fastops")
    m(small)
    assert ours == ["fastops", "fastops"]
    monkeypatch.setenv(policy.BACKEND_ENV, "torch")
    m(large)
    assert len(ours) == 2
    monkeypatch.setenv(policy.BACKEND_ENV, "cudnn")
    with pytest.raises(ValueError, match=r"nn.DepthwiseConv2d: FASTOPS_BACKEND='cudnn'; expected one of"):
        m(large)
    monkeypatch.delenv(policy.BACKEND_ENV)
    m.backend = "fast"
    with pytest.raises(ValueError, match=r"nn.DepthwiseConv2d: expected backend to be one of .*'fast'"):
        m(large)


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


def test_compiled_module_follows_the_region(auto: None, region: None) -> None:
    policy.register_slower_region(_small_map_region())
    m = DepthwiseConv2d(4, 3, padding=1)
    compiled = torch.compile(m, backend="eager")
    for shape in ((1, 4, 8, 8), (1, 4, 12, 12)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), F.conv2d(x, m.weight, m.bias, 1, 1, 1, 4))


def test_registered_regions_cite_results_that_exist() -> None:
    for r in policy.regions():
        files = re.findall(r"benchmarks/results/[\w./-]+\.md", r.evidence)
        assert files, f"{r.op} region {r.what!r} cites no benchmarks/results file"
        for f in files:
            assert (REPO / f).is_file(), f"{r.op} region cites {f}, which does not exist"


def test_register_rejects_non_regions() -> None:
    with pytest.raises(TypeError, match="expected a SlowerRegion"):
        policy.register_slower_region("depthwise small maps")  # type: ignore[arg-type]


def test_swapped_model_runs_ours_outside_regions(auto: None, region: None) -> None:
    # No region covers fp64 input: every swapped module runs our kernels.
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.GELU()).double()
    fastops.swap_modules(model)
    model(torch.randn(1, 4, 6, 6, dtype=torch.float64))
    assert sum(policy.fallback_counts().values()) == 0


def test_swap_report_names_the_regions_of_what_it_replaced(region: None) -> None:
    policy.register_slower_region(_small_map_region())
    model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, groups=4), nn.ReLU())
    report = fastops.swap_modules(model)
    assert report.torch_fallbacks() == ["depthwise_conv2d on cpu, test: maps up to 8x8: test"]
    assert "run PyTorch's kernel where it is measured faster" in str(report)
    assert fastops.swap_modules(nn.Sequential(nn.GELU())).torch_fallbacks() == []


def _conv_case(
    isa: str, channels_last: bool, dtype: torch.dtype, training: bool, side: int, k: int, s: int, c: int = 96
):
    shape = (16, c, side, side)
    params = {"kernel_size": (k, k), "stride": (s, s)}
    return policy.Case("depthwise_conv2d", "cpu", isa, channels_last, dtype, shape, training, params)


def test_registered_depthwise_regions() -> None:
    def torch_runs(*case_args: object) -> bool:
        case = _conv_case(*case_args)  # type: ignore[arg-type]
        return any(r.covers(case) for r in policy.regions("depthwise_conv2d"))

    # Measured (benchmarks/results/swap_policy_cpu_dw_nchw*, depthwise_conv2d_cpu_nchw_blocked.md):
    # oneDNN wins NCHW fp32 7x7 kernels on maps to 14x14 inference on AVX2 (on AVX-512 too until the
    # channel-blocked rows kept their accumulators in registers); ours (the channel-blocked kernels)
    # 3x3 on 7x7 maps, the strided small maps, 7x7 kernels from 28x28 and, on AVX2, every 3x3 map; on
    # AVX-512 the register path 3x3 stride-1 maps to 16 wide (14x14 since 2026-11-28).
    assert not torch_runs("avx512", False, torch.float32, False, 14, 3, 1)
    assert torch_runs("avx512", False, torch.float32, False, 14, 5, 1)  # 5x5 not measured
    assert not torch_runs("avx512", False, torch.float32, False, 7, 3, 1)
    assert not torch_runs("avx512", False, torch.float32, True, 7, 3, 1)
    assert not torch_runs("avx512", False, torch.float32, True, 14, 3, 2)
    assert not torch_runs("avx512", False, torch.float32, True, 14, 3, 1)
    assert not torch_runs("avx512", False, torch.float32, True, 28, 3, 2)
    assert not torch_runs("avx512", False, torch.float32, False, 28, 3, 2)
    assert not torch_runs("avx512", False, torch.float32, False, 28, 7, 1)
    assert not torch_runs("avx512", False, torch.float32, False, 14, 7, 1)
    assert not torch_runs("avx512", False, torch.float32, False, 7, 7, 1)
    assert torch_runs("avx512", False, torch.float32, True, 7, 7, 1) is False  # our 7x7 wgrad wins
    assert not torch_runs("avx512", False, torch.float32, False, 112, 3, 1)
    assert not torch_runs("avx2", False, torch.float32, False, 7, 3, 1)
    assert not torch_runs("avx2", False, torch.float32, True, 14, 3, 2)
    assert not torch_runs("avx2", False, torch.float32, False, 28, 7, 1)
    assert torch_runs("avx2", False, torch.float32, False, 14, 7, 1)
    assert not torch_runs("avx2", False, torch.bfloat16, False, 7, 3, 1)  # no oneDNN bf16 on AVX2
    # channels_last (swap_policy_cpu_dw_cl*): oneDNN wins small 3x3 maps and 7x7 inference on
    # AVX-512, bf16 inference everywhere there; ours wins the 7x7 training step and AVX2 bf16.
    assert torch_runs("avx512", True, torch.float32, False, 7, 3, 1)
    assert not torch_runs("avx512", True, torch.float32, False, 56, 3, 1)
    assert torch_runs("avx512", True, torch.float32, False, 56, 7, 1)
    assert not torch_runs("avx512", True, torch.float32, True, 7, 7, 1)
    assert torch_runs("avx512", True, torch.bfloat16, False, 112, 3, 1)
    # Strided 3x3 fp32 on AVX-512 (swap_policy_cpu_dw_cl_s2_b*_zen5: 0.66-0.94x), both modes.
    assert torch_runs("avx512", True, torch.float32, False, 112, 3, 2)
    assert torch_runs("avx512", True, torch.float32, True, 56, 3, 2)
    assert not torch_runs("avx512", True, torch.float32, True, 56, 3, 1)
    assert not torch_runs("avx512", True, torch.bfloat16, True, 28, 3, 2)  # strided bf16 training
    assert torch_runs("avx2", True, torch.float32, False, 56, 3, 1)
    assert not torch_runs("avx2", True, torch.float32, False, 14, 3, 1)
    assert not torch_runs("avx2", True, torch.bfloat16, False, 56, 3, 1)
    assert not torch_runs("avx2", True, torch.float32, False, 14, 5, 1)  # 5x5 not measured: ours
    assert torch_runs("avx2", True, torch.float32, True, 56, 3, 1)
    assert not torch_runs("avx2", True, torch.float32, True, 14, 3, 1)
    # The digits ConvNet's few-channel small maps (swap_policy_cpu_dw_digits*): oneDNN wins in
    # channels_last; ours wins every NCHW map (on AVX-512 the stride-1 4x4 and 8x8 since the register
    # path, the strided 16x16 one since the strided register path, strided training since plain
    # stores, strided 8x8 inference since static_for_inlined: 1.76x).
    fp32 = torch.float32
    assert torch_runs("avx512", True, fp32, True, 16, 3, 1, 32)
    assert not torch_runs("avx512", False, fp32, False, 16, 3, 2, 32)  # the strided register path
    assert not torch_runs("avx512", False, fp32, False, 8, 3, 2, 64)
    assert not torch_runs("avx512", False, fp32, True, 4, 3, 1, 128)
    assert not torch_runs("avx512", False, fp32, False, 4, 3, 1, 128)
    assert not torch_runs("avx512", False, fp32, True, 8, 3, 1, 64)
    assert not torch_runs("avx512", False, fp32, False, 8, 3, 1, 64)
    assert not torch_runs("avx512", False, fp32, True, 8, 3, 2, 64)  # since plain stores (1.54x)
    assert not torch_runs("avx512", False, fp32, True, 16, 3, 1, 32)
    assert not torch_runs("avx2", False, fp32, True, 8, 3, 1, 64)
    assert not torch_runs("avx2", False, fp32, True, 8, 3, 2, 64)
    assert not torch_runs("avx2", False, fp32, True, 16, 3, 1, 32)
    assert torch_runs("avx2", True, fp32, True, 16, 3, 1, 32)
    assert torch_runs("avx2", True, fp32, False, 8, 3, 1, 64)
    assert torch_runs("avx2", True, fp32, False, 4, 3, 1, 128)


def test_registered_depthwise_separable_regions() -> None:
    """The fused depthwise + 1x1 forward loses to eager's pair on AVX2 and at stride 2 on AVX-512
    (depthwise_separable_conv2d_cpu*_zen5_threads1.md); the module runs the pair there."""

    def torch_runs(isa: str, s: int) -> bool:
        case = dataclasses.replace(
            _conv_case(isa, True, torch.float32, False, 56, 3, s), op="depthwise_separable_conv2d"
        )
        return any(r.covers(case) for r in policy.regions("depthwise_separable_conv2d"))

    assert torch_runs("avx2", 1) and torch_runs("avx2", 2)
    assert torch_runs("avx512", 2)
    assert not torch_runs("avx512", 1)


def test_separable_module_runs_the_pair_in_a_region(auto: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import fastops.nn.depthwise_separable_conv2d as mod

    calls: list[int] = []
    fused = mod.depthwise_separable_conv2d
    monkeypatch.setattr(mod, "depthwise_separable_conv2d", lambda *a: calls.append(1) or fused(*a))
    x = torch.randn(2, 16, 12, 12).contiguous(memory_format=torch.channels_last)
    for stride, isa, want_fused in ((1, "avx512", True), (2, "avx512", False), (1, "avx2", False)):
        monkeypatch.setattr(policy, "cpu_isa", lambda isa=isa: isa)
        policy._DECISIONS.clear()
        m = fastops.nn.DepthwiseSeparableConv2d(16, 24, 3, stride=stride, padding=1).eval()
        m.depthwise.backend = "torch"  # the pair, unfused, as the reference
        with torch.no_grad():
            want = m(x)
            m.depthwise.backend = "auto"
            before, counted = len(calls), policy.fallback_counts()["depthwise_separable_conv2d"]
            torch.testing.assert_close(m(x), want)
        assert (len(calls) > before) == want_fused, (stride, isa)
        assert (policy.fallback_counts()["depthwise_separable_conv2d"] > counted) == (not want_fused)


def test_registered_clipped_log_region() -> None:
    """AVX2's small fp32 forward (clipped_log_cpu_avx2*_zen5_threads1.md: 0.84-0.89x eager)."""

    def torch_runs(isa: str, numel: int, dtype: torch.dtype = torch.float32, training: bool = False) -> bool:
        case = policy.Case("clipped_log", "cpu", isa, False, dtype, (numel,), training, {})
        return any(r.covers(case) for r in policy.regions("clipped_log"))

    assert torch_runs("avx2", 1 << 16) and torch_runs("avx2", 1 << 20)
    assert not torch_runs("avx2", 1 << 24)
    assert not torch_runs("avx2", 1 << 16, training=True)  # fwd+bwd: ours 2.4x and more
    assert not torch_runs("avx2", 1 << 16, torch.bfloat16)
    assert not torch_runs("avx512", 1 << 16)


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
