"""fastops.gelu / fastops.bias_gelu: their contract specs, and the edge cases of their own (tail accuracy,
special values, determinism, errors, CUDA grid and alignment paths, >2^31 elements)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fastops
from fastops import reference
from tests.helpers import (
    DEVICES,
    LARGE_NUMEL,
    SHAPES,
    assert_close_to_reference,
    cuda_only,
    devices,
    dtypes,
    layouts,
    spot_slices,
)
from tests.ops.contract import ContractTests, OpSpec, Sample, check_close

APPROXIMATE = ("none", "tanh")
FORMS = pytest.mark.parametrize("approximate", APPROXIMATE)


def _values(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """N(0, 3^2) values plus a share of deep negative-tail values and exact zeros."""
    x = torch.randn(shape, dtype=torch.float64) * 3
    if x.numel():
        flat = x.view(-1)
        flat[::7] = -5 - 7 * torch.rand(flat[::7].shape, dtype=torch.float64)  # [-12, -5]
        flat[3::11] = 0.0
    return x.to(dtype=dtype, device=device)


def _opcheck_shapes(device: str, dtype: torch.dtype) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """x (requiring grad) and an upstream gradient, for opcheck."""
    for shape in [(5,), (3, 4), (2, 3, 4, 5), (0, 3)]:
        x = (torch.randn(shape, dtype=dtype, device=device) * 2).requires_grad_(True)
        yield x, torch.randn(shape, dtype=dtype, device=device)


# ---- gelu -----------------------------------------------------------------------------------------


def gelu_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    """Every shape of SHAPES in every layout of `layouts`, in both forms."""
    for shape in SHAPES:
        base = _values(shape, dtype, device)
        for approximate in APPROXIMATE:
            for layout, x in layouts(base):
                x = x.detach().requires_grad_(requires_grad)
                yield Sample((x, approximate), id=f"{shape}-{approximate}-{layout}")


def gelu_small(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    for approximate in APPROXIMATE:
        x = (torch.randn(40, dtype=torch.float64) * 3).to(dtype=dtype, device=device)
        x = x.view(-1, 5).t().requires_grad_(requires_grad)  # a transposed view
        yield Sample((x, approximate), id=f"transposed-{approximate}")


def gelu_opcheck(device: str, dtype: torch.dtype) -> Iterator[tuple]:
    for x, g in _opcheck_shapes(device, dtype):
        for approximate in APPROXIMATE:
            yield torch.ops.fastops.gelu.default, (x, approximate)
            yield torch.ops.fastops.gelu_backward.default, (g, x.detach(), approximate)


GELU = OpSpec(
    name="gelu",
    op=fastops.gelu,
    reference=reference.gelu,
    eager=lambda x, approximate="none": F.gelu(x, approximate=approximate),
    sample_inputs=gelu_samples,
    small_inputs=gelu_small,
    opcheck_inputs=gelu_opcheck,
    autocast="input",
    output_format="preserve_format",
    gradgradcheck=True,
)


class TestGeluContract(ContractTests):
    spec = GELU


# ---- bias_gelu ------------------------------------------------------------------------------------


def _bias_layouts(t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Views of t with the same shape (the last dim stays the bias dim) in several layouts."""
    yield "contiguous", t
    if t.dim() >= 2:
        yield "column-major", t.transpose(0, -1).contiguous().transpose(0, -1)
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    wide[..., ::2] = t
    yield "sliced", wide[..., ::2]
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    flat[1:] = t.reshape(-1)
    yield "offset1", flat[1:].view(t.shape)


BIAS_SHAPES = [
    (1,),
    (7,),
    (5, 1),
    (3, 17),
    (4, 33),
    (6, 10),
    (2, 3, 10),
    (2, 3, 16),
    (2, 3, 4, 5),
    (2, 3, 4, 10),
    (300, 1100),
    (0, 6),
    (2, 0, 5),
    (3, 0),
]


def bias_gelu_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    """Every shape of BIAS_SHAPES in every layout of `_bias_layouts`, in both forms; and a bias one
    element off 16-byte alignment next to an aligned x with a vector-multiple row, where the kernels
    must take the element path for the whole launch (the vector path would read bias misaligned)."""
    for shape in BIAS_SHAPES:
        base = _values(shape, dtype, device)
        bias = (torch.randn(shape[-1], dtype=torch.float64) * 2).to(dtype=dtype, device=device)
        bias.requires_grad_(requires_grad)
        for approximate in APPROXIMATE:
            for layout, x in _bias_layouts(base):
                x = x.detach().requires_grad_(requires_grad)
                yield Sample((x, bias, approximate), id=f"{shape}-{approximate}-{layout}")
    x = _values((37, 64), dtype, device).requires_grad_(requires_grad)
    bias = torch.randn(65, dtype=torch.float64).to(dtype=dtype, device=device)[1:]
    assert x.data_ptr() % 16 == 0 and bias.data_ptr() % 16 != 0
    bias.requires_grad_(requires_grad)
    for approximate in APPROXIMATE:
        yield Sample((x, bias, approximate), id=f"unaligned-bias-{approximate}")


def bias_gelu_small(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    for approximate in APPROXIMATE:
        x = (torch.randn(3, 4, 6, dtype=torch.float64) * 2).to(dtype=dtype, device=device)
        b = torch.randn(6, dtype=torch.float64).to(dtype=dtype, device=device)
        yield Sample(
            (x.requires_grad_(requires_grad), b.requires_grad_(requires_grad), approximate), id=approximate
        )


def bias_gelu_opcheck(device: str, dtype: torch.dtype) -> Iterator[tuple]:
    for x, g in _opcheck_shapes(device, dtype):
        b = torch.randn(x.shape[-1], dtype=dtype, device=device).requires_grad_(True)
        for approximate in APPROXIMATE:
            yield torch.ops.fastops.bias_gelu.default, (x, b, approximate)
            yield torch.ops.fastops.bias_gelu_backward.default, (g, x.detach(), b.detach(), approximate)


BIAS_GELU = OpSpec(
    name="bias_gelu",
    op=fastops.bias_gelu,
    reference=reference.bias_gelu,
    eager=lambda x, bias, approximate="none": F.gelu(x + bias, approximate=approximate),
    sample_inputs=bias_gelu_samples,
    small_inputs=bias_gelu_small,
    opcheck_inputs=bias_gelu_opcheck,
    autocast="input",
    output_format="contiguous_format",
    # grad_bias sums over up to 300 rows: fp32 accumulation error grows with it.
    fp32_tolerances={"grad_bias": (1e-5, 1e-4)},
    gradgradcheck=True,
)


class TestBiasGeluContract(ContractTests):
    spec = BIAS_GELU


# ---- gelu: accuracy and special values ------------------------------------------------------------


def _ulps(actual: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    spacing = torch.from_numpy(__import__("numpy").spacing(ref64.float().abs().cpu().numpy())).double()
    return (actual.double().cpu() - ref64.cpu()).abs() / spacing


@devices
def test_erf_form_negative_tail_is_accurate(device: str) -> None:
    """In [-13, -5] eager fp32 has ~100% relative error (1 + erf rounds away); ours stays at a few ulp."""
    x = torch.linspace(-13.0, -5.0, 20001, device=device)
    ref = reference.gelu(x.double())
    ours = fastops.gelu(x)
    rel = ((ours.double() - ref) / ref).abs()
    assert rel.max().item() < 1e-6, f"max relative error {rel.max().item():.3e} at x={x[rel.argmax()].item()}"
    assert _ulps(ours, ref).max().item() <= 8
    eager_rel = ((F.gelu(x).double() - ref) / ref).abs()
    assert eager_rel.max().item() > 0.5  # what the test protects against: eager's cancellation
    # The gradient Phi(x) + x phi(x) keeps its relative accuracy there too.
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fastops.gelu(xg).sum(), xg)
    x64 = x.double().requires_grad_(True)
    (grad64,) = torch.autograd.grad(reference.gelu(x64).sum(), x64)
    grad_rel = ((grad.double() - grad64) / grad64).abs()
    assert grad_rel.max().item() < 2e-6, f"gradient max relative error {grad_rel.max().item():.3e}"


@devices
def test_erf_bulk_and_general_evaluations_agree(device: str) -> None:
    """The CPU kernels evaluate a vector whose lanes all have |x| <= 7 with a cheaper formula and any
    other vector with the general one: the same x meets the ulp bound (forward) and the gradient
    bound either way, at the boundary too."""
    edge = [7.0, -7.0, math.nextafter(7.0, 8.0), math.nextafter(-7.0, -8.0), 0.0, -0.0]
    x = torch.cat([torch.linspace(-7.5, 7.5, 30001), torch.tensor(edge)]).to(device)
    # Every vector of `mixed` holds lanes of -30 (outside the bulk) between the values of x.
    mixed = torch.stack([x, torch.full_like(x, -30.0)], 1).flatten()
    ref = reference.gelu(x.double())
    normal = (ref.abs() > torch.finfo(torch.float32).tiny).cpu()
    x64 = x.double().requires_grad_(True)
    (grad64,) = torch.autograd.grad(reference.gelu(x64).sum(), x64)
    for name, inp in (("bulk", x), ("general", mixed)):
        step = 1 if name == "bulk" else 2
        y = fastops.gelu(inp)[::step]
        ulps = _ulps(y, ref)[normal]
        assert ulps.max().item() <= 8, f"{name}: {ulps.max().item():.1f} ulp"
        xg = inp.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(fastops.gelu(xg).sum(), xg)
        err = (grad[::step].double() - grad64).abs().max().item()
        assert err < 1e-6, f"{name}: gradient error {err:.2e}"


def test_cpu_erf_gradient_keeps_relative_accuracy_at_its_root() -> None:
    """gelu'(x) = Phi(x) + x phi(x) is 0 at x = -0.7518. Written as that sum it cancels there (the
    result's relative error grows without bound, and is ~8e-6 even 0.01 away); the CPU kernels write it
    as exp(-x^2/2) (u0 - |x|) r(|x|) with u0 - |x| exact, so every fp32 gradient of the bulk, the
    root included, stays within ~6e-7 of the float64 value, relative."""
    u0 = 0.75179152469356425
    near = torch.linspace(-u0 - 1e-3, -u0 + 1e-3, 20001, dtype=torch.float64).float()
    x = torch.cat([near, torch.linspace(-7.0, 7.0, 200001)])
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fastops.gelu(xg).sum(), xg)
    x64 = x.double().requires_grad_(True)
    (grad64,) = torch.autograd.grad(reference.gelu(x64).sum(), x64)
    nonzero = grad64 != 0
    rel = ((grad.double() - grad64) / grad64)[nonzero].abs()
    assert rel.max().item() < 2e-6, (
        f"max relative error {rel.max().item():.3e} at x={x[nonzero][rel.argmax()].item()}"
    )
    # The same through bias_gelu's backward (x + bias formed in fp32 first).
    bias = torch.full((x.numel(),), 0.25)
    xb = (x - 0.25).reshape(1, -1)
    (grad_b,) = torch.autograd.grad(fastops.bias_gelu(xb.requires_grad_(True), bias).sum(), xb)
    z64 = (xb.detach().double() + 0.25).requires_grad_(True)
    (grad_b64,) = torch.autograd.grad(reference.gelu(z64).sum(), z64)
    ok = grad_b64 != 0
    rel_b = ((grad_b.double() - grad_b64) / grad_b64)[ok].abs()
    assert rel_b.max().item() < 2e-6, f"bias_gelu: max relative error {rel_b.max().item():.3e}"


@devices
@FORMS
def test_fp32_ulp_accuracy_everywhere(device: str, approximate: str) -> None:
    """Stricter than assert_close's atol=1e-5 (which alone would pass a 1e-5 relative error in the
    curve): every normal fp32 result within a few ulp of the float64 value."""
    lo = -13.0 if approximate == "none" else -10.0
    x = torch.linspace(lo, 10.0, 200001, device=device)
    ref = reference.gelu(x.double(), approximate)
    ours = fastops.gelu(x, approximate)
    normal = ref.abs() > torch.finfo(torch.float32).tiny
    # tanh: the rounding of y = k (x + c x^3) in fp32 is amplified by |2 y x'| far left (see below).
    limit = 8 if approximate == "none" else 400
    ulps = _ulps(ours, ref)[normal.cpu()]
    assert ulps.max().item() <= limit, f"{ulps.max().item():.1f} ulp at x={x[normal][ulps.argmax()].item()}"
    core = (x.abs() <= 4).cpu()
    assert _ulps(ours, ref)[core & normal.cpu()].max().item() <= (8 if approximate == "none" else 24)


@devices
def test_tanh_form_negative_tail_is_accurate(device: str) -> None:
    """x * sigmoid(2y) has no cancellation; what is left is fp32 rounding of y itself (|y| ~ 44 at
    x = -10, so one ulp of y moves the result by ~20 ulp). Eager's 0.5 x (1 + tanh y) returns 0 or
    garbage there."""
    x = torch.linspace(-10.0, -3.0, 20001, device=device)
    ref = reference.gelu(x.double(), "tanh")
    ours = fastops.gelu(x, "tanh")
    rel = ((ours.double() - ref) / ref).abs()
    assert rel.max().item() < 3e-5, f"max relative error {rel.max().item():.3e} at x={x[rel.argmax()].item()}"
    eager_rel = ((F.gelu(x, approximate="tanh").double() - ref) / ref).abs()
    assert eager_rel.max().item() > 0.5


@devices
@dtypes
@FORMS
def test_special_values(device: str, dtype: torch.dtype, approximate: str) -> None:
    values = [-math.inf, math.inf, math.nan, 0.0, -0.0, -30.0, 30.0, 1.0, -1.0]
    x = torch.tensor(values, dtype=dtype, device=device)
    y = fastops.gelu(x, approximate)
    assert torch.isnan(y[0]), "gelu(-inf) is nan, as in PyTorch"
    assert y[1].item() == math.inf, "gelu(+inf) = +inf"
    assert torch.isnan(y[2])
    assert y[3].item() == 0.0 and math.copysign(1.0, y[3].item()) == 1.0
    assert y[4].item() == 0.0 and math.copysign(1.0, y[4].item()) == -1.0, "gelu(-0.0) = -0.0, as in PyTorch"
    assert y[5].item() == 0.0 and y[6].item() == 30.0
    # Everything against PyTorch's float64 gelu (whose vectorized fp32 CPU path returns nan for +inf).
    want = F.gelu(x.double(), approximate=approximate)
    assert_close_to_reference(y, want, rtol=1e-2 if dtype != torch.float32 else None)
    # Gradients: nan at +-inf and nan (inf * 0 in the derivative, as PyTorch), 0.5 at 0, 0 far left.
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fastops.gelu(xg, approximate), xg, torch.ones_like(x))
    x64 = x.double().requires_grad_(True)
    (want_grad,) = torch.autograd.grad(F.gelu(x64, approximate=approximate), x64, torch.ones_like(x64))
    assert_close_to_reference(grad, want_grad, rtol=1e-2 if dtype != torch.float32 else None)
    assert grad[3].item() == 0.5 and grad[5].item() == 0.0 and grad[6].item() == 1.0


@devices
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_subnormal_results_are_rounded_not_flushed(device: str, dtype: torch.dtype) -> None:
    # gelu(x) ~ x / 2 and gelu'(0) = 1/2: subnormal fp32 results, which the narrowing must round to
    # the nearest fp16/bf16 as PyTorch does (AVX512_BF16's instruction alone would flush them to zero).
    # 40 values, so that whole vectors and a partial one (16 and 32 lanes) both carry them.
    tiny = torch.finfo(dtype).tiny
    # down to tiny * 2^-7 (bf16: 2^-133, its smallest subnormal), so every x and x / 2 is nonzero
    scales = torch.tensor([2.0**-k for k in range(1, 7)], dtype=torch.float64)
    x64 = torch.cat([scales, -scales] * 4)[:40] * tiny
    x = x64.to(dtype=dtype, device=device)
    assert (x != 0).all()
    y = fastops.gelu(x)
    assert (y != 0).all(), f"subnormal results flushed to zero: {y[y == 0]}"
    assert_close_to_reference(y, F.gelu(x.double()), rtol=1e-2)
    zeros = torch.zeros_like(x)
    dx = torch.ops.fastops.gelu_backward(x, zeros, "none")
    assert torch.equal(dx, (x.float() * 0.5).to(dtype))
    rows = torch.stack([x, x])
    dx2, _ = torch.ops.fastops.bias_gelu_backward(rows, torch.zeros_like(rows), zeros, "none")
    assert torch.equal(dx2, (rows.float() * 0.5).to(dtype))


# ---- the CUDA forward for fp16/bf16 outputs (csrc/cuda/gelu.cu, *_forward_reduced) -------------------
# Checked here, on the CPU, as a design: the fit's coefficients read from gelu_math.h, every fp32
# rounding of the device code, and the approximate reciprocal and exp2 (MUFU.RCP, MUFU.EX2) pushed to
# errors beyond their documented bounds in both directions. The CUDA contract tests run the kernel.


def _header_floats(name: str) -> list[float]:
    header = Path(__file__).resolve().parents[2] / "csrc/include/fastops/gelu_math.h"
    match = re.search(name + r" = \{([^}]*)\}", header.read_text())
    assert match, f"{name} not found in {header}"
    return [float(v.strip().rstrip("f")) for v in match.group(1).split(",")]


def _f32(v: torch.Tensor) -> torch.Tensor:
    """One fp32 rounding of a float64 result (an fp32 op, or an FMA: a*b + c is exact in float64 for
    fp32 a, b up to the rounding of the sum, which this rounds once more: at most 1/2 ulp of fp32 off)."""
    return v.float().double()


def _f32_const(c: float) -> float:
    """A constant as the device code holds it: rounded to fp32 once."""
    return torch.tensor(c, dtype=torch.float32).item()


def _every_value(dtype: torch.dtype) -> torch.Tensor:
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype).double()
    return x[torch.isfinite(x)]


def _ordered_bits(v: torch.Tensor) -> torch.Tensor:
    """fp16/bf16 bit patterns as integers in the order of the values (adjacent values differ by 1)."""
    bits = v.view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def _reduced_erf(x: torch.Tensor, rcp_err: float, exp_err: float) -> torch.Tensor:
    """erf_forward_reduced's bulk in fp32 steps (x float64 holding fp32 values, |x| <= 7)."""
    n0, n1, n2 = _header_floats("kBulkNReduced")
    d0, d1, d2 = _header_floats("kBulkDReduced")
    u = x.abs()
    num = _f32(_f32(n2 * u + n1) * u + n0)
    den = _f32(_f32(_f32(u + d2) * u + d1) * u + d0)
    uq = _f32(u * _f32(num * _f32(_f32(1.0 / den) * (1 + rcp_err))))
    arg = _f32(_f32(u * u) * _f32_const(-0.5 * math.log2(math.e)))
    e = _f32(torch.exp2(arg) * (1 + exp_err))
    return _f32(-uq * e + torch.where(x >= 0, x, 0.0))


def _reduced_tanh(x: torch.Tensor, rcp_err: float, exp_err: float) -> torch.Tensor:
    k, kc = 0.7978845608028654, 0.7978845608028654 * 0.044715
    y = _f32(x * _f32(_f32(_f32_const(kc) * x) * x + _f32_const(k)))
    arg = _f32(y.abs() * _f32_const(-2.0 * math.log2(math.e)))
    e = _f32(torch.exp2(arg) * (1 + exp_err))
    xr = _f32(x * _f32(_f32(1.0 / _f32(1.0 + e)) * (1 + rcp_err)))
    return torch.where(y >= 0, xr, _f32(xr * e))


@pytest.mark.parametrize("approximate", APPROXIMATE)
def test_reduced_half_forward_design_on_the_host(approximate: str) -> None:
    # MUFU.RCP is within 1 ulp (2^-23) and MUFU.EX2 within 2^-22.5 relative: pushed to 2^-21 both ways.
    worst = [(r, e) for r in (-(2.0**-21), 2.0**-21) for e in (-(2.0**-21), 2.0**-21)]
    evaluate = _reduced_erf if approximate == "none" else _reduced_tanh
    bulk = 7.0 if approximate == "none" else math.inf  # the erf form's fallback takes the rest
    for dtype in (torch.bfloat16, torch.float16):
        x = _every_value(dtype)
        x = x[x.abs() <= bulk]
        exact = reference.gelu(x, approximate)
        want = exact.to(dtype).double()  # correctly rounded
        ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10  # tests.helpers.ulp_floor
        for rcp_err, exp_err in worst:
            got = evaluate(x, rcp_err, exp_err).to(dtype).double()
            # The contract tests' bound for fp16/bf16 (the 2x rule with eager's error taken as 0).
            bad = (got - exact).abs() > 2 * ulp * exact.abs() + 1e-6
            assert not bad.any(), f"{dtype}: x={x[bad][:4].tolist()} got {got[bad][:4].tolist()}"
            # Off the correctly rounded value by at most one step, and only where the value lies within
            # ~1e-5 relative of a rounding boundary (measured: 0.4% of the bf16 inputs, 1.4% of fp16).
            steps = (_ordered_bits(got.to(dtype)) - _ordered_bits(want.to(dtype))).abs()
            assert steps.max().item() <= 1 and (steps > 0).float().mean().item() < 0.02
    # bias_gelu rounds x + bias only at its output: fp32 inputs too, relative error of the fp32 result.
    x = torch.linspace(-7.0, 7.0, 400001, dtype=torch.float64).float().double()
    if approximate == "tanh":
        x = torch.cat([x, torch.linspace(-9.0, -7.0, 20001, dtype=torch.float64).float().double()])
    exact = reference.gelu(x, approximate)
    for rcp_err, exp_err in worst:
        rel = ((evaluate(x, rcp_err, exp_err) - exact).abs() / exact.abs().clamp_min(1e-30))[exact != 0]
        assert rel.max().item() < 4e-5, f"max relative error {rel.max().item():.2e}"


# ---- the CUDA erf-form backward for fp16/bf16 outputs (csrc/cuda/gelu.cu, erf_backward_reduced) ---------


def _reduced_erf_backward(x: torch.Tensor, rcp_err: float, exp_err: float) -> torch.Tensor:
    """erf_backward_reduced's bulk (g = 1) in fp32 steps (x float64 holding fp32 values, |x| <= 7)."""
    # The constants as the device holds them, rounded to fp32 (u0's split only works with the fp32 hi).
    n0, n1, n2, n3 = (_f32_const(c) for c in _header_floats("kGradRatioN"))
    d0, d1, d2 = (_f32_const(c) for c in _header_floats("kGradRatioD"))
    root_hi, root_lo = (_f32_const(c) for c in _header_floats("kGradRoot"))
    u = x.abs()
    num = _f32(_f32(_f32(n3 * u + n2) * u + n1) * u + n0)
    den = _f32(_f32(_f32(u + d2) * u + d1) * u + d0)
    ratio = _f32(num * _f32(_f32(1.0 / den) * (1 + rcp_err)))
    k = _f32(_f32(_f32(root_hi - u) + root_lo) * ratio)
    arg = _f32(_f32(u * u) * _f32_const(-0.5 * math.log2(math.e)))
    ek = _f32(_f32(torch.exp2(arg) * (1 + exp_err)) * k)
    return torch.where(x >= 0, _f32(1.0 - ek), ek)


def _exact_erf_backward(x: torch.Tensor) -> torch.Tensor:
    """gelu'(x) = Phi(x) + x phi(x) in float64 (erfc: no cancellation in Phi itself; the sum's near
    x = -0.75 costs float64 ~1e-16 / |gelu'|, far below what fp32 results can see)."""
    return 0.5 * torch.special.erfc(-x / math.sqrt(2.0)) + x * torch.exp(-0.5 * x * x) / math.sqrt(
        2.0 * math.pi
    )


def test_reduced_half_backward_design_on_the_host() -> None:
    # MUFU.RCP and MUFU.EX2 pushed past their documented errors both ways, as for the forward.
    worst = [(r, e) for r in (-(2.0**-21), 2.0**-21) for e in (-(2.0**-21), 2.0**-21)]
    for dtype in (torch.bfloat16, torch.float16):
        x = _every_value(dtype)
        x = x[x.abs() <= 7.0]
        exact = _exact_erf_backward(x)
        want = exact.to(dtype)
        for rcp_err, exp_err in worst:
            got = _reduced_erf_backward(x, rcp_err, exp_err).to(dtype)
            # Within one step of the correctly rounded gradient, one step only near a rounding boundary
            # (measured: under 0.01% of the bf16 inputs, 0.15% of fp16), the root's neighbours included.
            steps = (_ordered_bits(got) - _ordered_bits(want)).abs()
            assert steps.max().item() <= 1, f"{dtype}: x={x[steps > 1][:4].tolist()}"
            assert (steps > 0).float().mean().item() < 0.005
    # bias_gelu's backward takes fp32 x + bias: relative error of the fp32 result on a dense grid and
    # right around the root, where the unfactored sum would lose every bit.
    root = 0.75179152469356425
    x = torch.cat(
        [
            torch.linspace(-7.0, 7.0, 400001, dtype=torch.float64),
            -root + torch.linspace(-1e-3, 1e-3, 20001, dtype=torch.float64),
        ]
    )
    x = x.float().double()
    exact = _exact_erf_backward(x)
    for rcp_err, exp_err in worst:
        rel = ((_reduced_erf_backward(x, rcp_err, exp_err) - exact).abs() / exact.abs())[exact != 0]
        assert rel.max().item() < 1e-5, f"max relative error {rel.max().item():.2e}"


def test_fp64_matches_reference_tightly() -> None:
    # The tanh form's result is ill-conditioned in y = k (x + c x^3) far left (|y| ~ 1000 at x = -30):
    # one ulp of y is ~2000 ulp of the result, hence the looser bound there.
    x = torch.linspace(-30, 10, 4001, dtype=torch.float64)
    for approximate, bound in (("none", 1e-13), ("tanh", 1e-11)):
        ref = reference.gelu(x, approximate)
        got = fastops.gelu(x, approximate)
        nz = ref != 0
        rel = ((got - ref).abs() / ref.abs())[nz]
        assert rel.max().item() < bound, (approximate, rel.max().item())


# ---- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64])
def test_rejects_non_float_dtypes(dtype: torch.dtype) -> None:
    x = torch.ones(3, dtype=dtype)
    with pytest.raises(TypeError, match=r"fastops\.gelu: expected x to be a float32"):
        fastops.gelu(x)
    with pytest.raises(RuntimeError, match=r"fastops\.gelu: expected x"):
        torch.ops.fastops.gelu(x, "none")
    with pytest.raises(TypeError, match=r"fastops\.bias_gelu: expected x to be a float32"):
        fastops.bias_gelu(x, torch.ones(3, dtype=dtype))


@pytest.mark.parametrize("approximate", ["tanh ", "erf", "", None, 1])
def test_rejects_bad_approximate(approximate: object) -> None:
    with pytest.raises(ValueError, match=r"fastops\.gelu: expected approximate to be 'none' or 'tanh'"):
        fastops.gelu(torch.ones(3), approximate)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"fastops\.bias_gelu: expected approximate to be 'none' or 'tanh'"):
        fastops.bias_gelu(torch.ones(3), torch.ones(3), approximate)  # type: ignore[arg-type]
    if isinstance(approximate, str):
        with pytest.raises(RuntimeError, match=r"fastops\.gelu: expected approximate to be 'none' or 'tanh'"):
            torch.ops.fastops.gelu(torch.ones(3), approximate)
        with pytest.raises(RuntimeError, match=r"fastops\.bias_gelu_backward: expected approximate"):
            torch.ops.fastops.bias_gelu_backward(torch.ones(3), torch.ones(3), torch.ones(3), approximate)


def test_backward_ops_check_shapes_and_dtypes() -> None:
    with pytest.raises(RuntimeError, match=r"gelu_backward: expected grad_out to have the shape of x"):
        torch.ops.fastops.gelu_backward(torch.ones(3), torch.ones(4), "none")
    with pytest.raises(RuntimeError, match=r"gelu_backward: expected grad_out to have the dtype of x"):
        torch.ops.fastops.gelu_backward(torch.ones(3, dtype=torch.float64), torch.ones(3), "none")
    with pytest.raises(RuntimeError, match=r"bias_gelu_backward: expected grad_out to have the shape of x"):
        torch.ops.fastops.bias_gelu_backward(torch.ones(2, 3), torch.ones(3, 3), torch.ones(3), "tanh")


def test_bias_gelu_rejects_bad_bias() -> None:
    x = torch.randn(4, 5)
    with pytest.raises(
        ValueError, match=r"fastops\.bias_gelu: expected bias to be 1-D with x\.shape\[-1\] = 5"
    ):
        fastops.bias_gelu(x, torch.randn(4))
    with pytest.raises(ValueError, match=r"fastops\.bias_gelu: expected bias to be 1-D"):
        fastops.bias_gelu(x, torch.randn(1, 5))
    with pytest.raises(TypeError, match=r"fastops\.bias_gelu: expected bias to have the dtype of x"):
        fastops.bias_gelu(x, torch.randn(5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"fastops\.bias_gelu: expected x to have at least one dimension"):
        fastops.bias_gelu(torch.tensor(1.0), torch.randn(1))
    with pytest.raises(
        RuntimeError, match=r"fastops\.bias_gelu: expected bias to be 1-D with x\.shape\[-1\] = 5"
    ):
        torch.ops.fastops.bias_gelu(x, torch.randn(4), "none")
    with pytest.raises(RuntimeError, match=r"fastops\.bias_gelu: expected bias to have the dtype of x"):
        torch.ops.fastops.bias_gelu(x, torch.randn(5, dtype=torch.float64), "none")
    with pytest.raises(TypeError, match=r"fastops\.bias_gelu: expected bias to be a torch\.Tensor"):
        fastops.bias_gelu(x, [1.0] * 5)  # type: ignore[arg-type]


# ---- bias_gelu: determinism -----------------------------------------------------------------------


@devices
@dtypes
def test_bias_gelu_grad_bias_is_deterministic(device: str, dtype: torch.dtype) -> None:
    x = torch.randn(1537, 777, device=device, dtype=dtype)
    b = torch.randn(777, device=device, dtype=dtype)
    g = torch.randn_like(x)
    first = torch.ops.fastops.bias_gelu_backward(g, x, b, "none")
    threads = torch.get_num_threads()
    try:
        for n in (1, max(2, threads)):
            torch.set_num_threads(n)
            again = torch.ops.fastops.bias_gelu_backward(g, x, b, "none")
            assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    finally:
        torch.set_num_threads(threads)


# ---- CUDA: errors, alignment, the grid clamp, >2^31 elements --------------------------------------


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
def test_cuda_rejects_float64_and_device_mismatch() -> None:
    with pytest.raises(TypeError, match=r"fastops\.gelu: expected x"):
        fastops.gelu(torch.ones(3, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match=r"gelu_backward: expected grad_out on the same device"):
        torch.ops.fastops.gelu_backward(torch.ones(3), torch.ones(3, device="cuda"), "none")
    with pytest.raises(RuntimeError, match=r"bias_gelu: expected bias on the same device as x"):
        fastops.bias_gelu(torch.ones(2, 3, device="cuda"), torch.ones(3))


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
def test_cuda_large_tensor_tail_and_unaligned() -> None:
    n = (1 << 22) + 5
    base = torch.randn(n + 1, device="cuda") * 3
    for x in (base[:n], base[1:]):  # aligned with a tail, and 4 bytes off 16-byte alignment
        for approximate in ("none", "tanh"):
            torch.testing.assert_close(fastops.gelu(x, approximate), reference.gelu(x, approximate))
    rows = torch.randn(4097 * 1001 + 1, device="cuda")
    b = torch.randn(1001, device="cuda")
    for x in (rows[:-1].view(4097, 1001), rows[1:].view(4097, 1001)):
        xg = x.detach().clone().requires_grad_(True)
        bg = b.detach().clone().requires_grad_(True)
        fastops.bias_gelu(xg, bg).sum().backward()
        x64, b64 = x.double().requires_grad_(True), b.double().requires_grad_(True)
        reference.bias_gelu(x64, b64).sum().backward()
        torch.testing.assert_close(xg.grad, x64.grad.float())
        torch.testing.assert_close(bg.grad, b64.grad.float(), rtol=1e-5, atol=1e-3)


@cuda_only
def test_cuda_bias_gelu_rows_past_the_grid_limit() -> None:
    """More rows than 65535 row blocks cover (4-wide rows: 128 rows a block), so the forward's grid-y
    is clamped and every thread strides over rows; the backward's 256 row blocks stride far more."""
    rows = 65535 * 128 + 4099
    for start in (0, 1):  # bias aligned (vector path) and one element off (element path)
        x = torch.randn(rows, 4, device="cuda") * 3
        bias = torch.randn(5, device="cuda")[start : start + 4]
        g = torch.randn_like(x)
        y = fastops.bias_gelu(x, bias)
        grad_x, grad_b = torch.ops.fastops.bias_gelu_backward(g, x, bias, "none")
        x64, b64 = x.double().requires_grad_(True), bias.double().requires_grad_(True)
        y64 = reference.bias_gelu(x64, b64)
        grad64, gradb64 = torch.autograd.grad(y64, (x64, b64), g.double())
        assert_close_to_reference(y, y64.detach())
        assert_close_to_reference(grad_x, grad64)
        # grad_bias sums 8.4M fp32 terms (grad64's rows) a column: bound it by their absolute sum.
        err = (grad_b.double() - gradb64).abs()
        assert (err <= 2e-5 * grad64.abs().sum(0)).all(), f"grad_bias: {grad_b} vs {gradb64}"


@pytest.mark.large
@cuda_only
def test_cuda_more_than_2_31_elements() -> None:
    """gelu forward/backward and bias_gelu forward/backward on bf16 tensors past 2^31 elements, checked
    against float64 at the start, across element 2^31 and at the tail; grad_bias in full."""
    x = torch.randn(LARGE_NUMEL, device="cuda", dtype=torch.bfloat16) * 3
    g = torch.randn_like(x)
    y = fastops.gelu(x)
    dx = torch.ops.fastops.gelu_backward(g, x, "none")
    for s in spot_slices(x.numel()):
        x64 = x[s].double().requires_grad_(True)
        y64 = reference.gelu(x64)
        (dx64,) = torch.autograd.grad(y64, x64, g[s].double())
        check_close(f"gelu forward {s}", y[s], y64.detach(), eager=F.gelu(x[s]))
        eager_dx = torch.ops.aten.gelu_backward(g[s], x[s])
        check_close(f"gelu backward {s}", dx[s], dx64, eager=eager_dx, factor=3.0)
    del y, dx
    cols = 4096  # rows of whole 16-byte vectors: the vector kernels, past 2^31 elements
    rows = LARGE_NUMEL // cols + 1
    del x, g
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    g = torch.randn_like(x)
    y = fastops.bias_gelu(x, bias)
    dx, db = torch.ops.fastops.bias_gelu_backward(g, x, bias, "none")
    for s in spot_slices(rows, width=16, edge=(1 << 31) // cols):
        x64, b64 = x[s].double().requires_grad_(True), bias.double().requires_grad_(True)
        y64 = reference.bias_gelu(x64, b64)
        (dx64,) = torch.autograd.grad(y64, x64, g[s].double())
        check_close(f"bias_gelu forward rows {s}", y[s], y64.detach(), eager=F.gelu(x[s] + bias))
        eager_dx = torch.ops.aten.gelu_backward(g[s], x[s] + bias)
        check_close(f"bias_gelu grad_x rows {s}", dx[s], dx64, eager=eager_dx, factor=3.0)
    # grad_bias over all rows, in float64 chunk by chunk, bounded by the terms' absolute sum.
    want = torch.zeros(cols, dtype=torch.float64, device="cuda")
    abs_sum = torch.zeros_like(want)
    for r in range(0, rows, 1 << 15):
        x64 = x[r : r + (1 << 15)].double().requires_grad_(True)
        (terms,) = torch.autograd.grad(
            reference.bias_gelu(x64, bias.double()), x64, g[r : r + (1 << 15)].double()
        )
        want += terms.sum(0)
        abs_sum += terms.abs().sum(0)
    err = (db.double() - want).abs()
    assert (err <= 2**-8 * want.abs() + 1e-5 * abs_sum).all(), (
        f"grad_bias: worst error {err.max().item():.3e}"
    )
