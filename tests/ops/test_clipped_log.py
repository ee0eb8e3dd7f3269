"""fastops.clipped_log: its contract spec, and the edge cases of its own (special values, eps held in
fp32, errors, CUDA alignment, >2^31 elements)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

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
from tests.ops.contract import ContractTests, OpSpec, Sample

MODES = {"straight": True, "exact": False}  # straight_through


def _eps_for(dtype: torch.dtype) -> float:
    # fp16 cannot hold g / 1e-6; a larger floor keeps the straight-through gradient finite there.
    return 1e-6 if dtype in (torch.float32, torch.float64) else 1e-3


def _values(shape: tuple[int, ...], dtype: torch.dtype, device: str, eps: float) -> torch.Tensor:
    """Values on both sides of eps: negatives, zeros, tiny positives, ones and large ones."""
    x = torch.randn(shape, dtype=torch.float64) * 3
    if x.numel():
        flat = x.view(-1)
        flat[::5] = eps * torch.rand(flat[::5].shape, dtype=torch.float64)  # just below eps
        flat[1::7] = 0.0
    return x.to(dtype=dtype, device=device)


def clipped_log_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    """Every shape of SHAPES in every layout of `layouts`, with both gradients."""
    # eps as the kernel holds it (fp32 for every half/fp32 input), so that the float64 reference
    # clamps at the very same value.
    eps = float(torch.tensor(_eps_for(dtype), dtype=torch.float32))
    for shape in SHAPES:
        base = _values(shape, dtype, device, eps)
        for mode, straight_through in MODES.items():
            for layout, x in layouts(base):
                x = x.detach().requires_grad_(requires_grad)
                yield Sample((x, eps, straight_through), id=f"{shape}-{mode}-{layout}")


def clipped_log_small(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    """Away from the kink at eps; straight-through is a surrogate below eps, so only x > eps there."""
    eps = 1e-3
    for mode, straight_through in MODES.items():
        low = torch.rand(20, dtype=torch.float64) * 0.5 * eps
        high = torch.rand(20, dtype=torch.float64) + 2 * eps
        x = torch.cat([high, low]) if not straight_through else high
        x = x.to(dtype=dtype, device=device).view(-1, 4).t()  # a transposed view
        yield Sample((x.requires_grad_(requires_grad), eps, straight_through), id=f"transposed-{mode}")


def clipped_log_opcheck(device: str, dtype: torch.dtype) -> Iterator[tuple]:
    for shape in [(5,), (3, 4), (2, 3, 4, 5), (0, 3)]:
        x = (torch.rand(shape, dtype=dtype, device=device) - 0.2).requires_grad_(True)
        g = torch.randn(shape, dtype=dtype, device=device)
        for straight_through in MODES.values():
            yield torch.ops.fastops.clipped_log.default, (x, 1e-3, straight_through)
            yield torch.ops.fastops.clipped_log_backward.default, (g, x.detach(), 1e-3, straight_through)


CLIPPED_LOG = OpSpec(
    name="clipped_log",
    op=fastops.clipped_log,
    reference=reference.clipped_log,
    sample_inputs=clipped_log_samples,
    small_inputs=clipped_log_small,
    opcheck_inputs=clipped_log_opcheck,
    autocast=torch.float32,
    output_format="preserve_format",
    gradgradcheck=True,
)


class TestClippedLogContract(ContractTests):
    spec = CLIPPED_LOG


# ---- edge cases --------------------------------------------------------------------------------------


@devices
@dtypes
def test_special_values(device: str, dtype: torch.dtype) -> None:
    eps = 0.25  # exactly representable in every dtype, so x == eps is hit exactly
    values = [math.nan, math.inf, -math.inf, 0.0, -0.0, eps, eps / 2, -1.0, 1.0, 4.0]
    x = torch.tensor(values, dtype=dtype, device=device)
    g = torch.tensor([1.0, 2.0, -1.0, 1.0, 1.0, 3.0, 1.0, 1.0, 2.0, 1.0], dtype=dtype, device=device)
    y = fastops.clipped_log(x, eps)
    expected = torch.log(torch.clamp(x.double(), min=eps))
    assert_close_to_reference(y, expected, rtol=1e-2 if dtype != torch.float32 else None)
    assert torch.isnan(y[0]) and y[1] == math.inf and y[2].item() == pytest.approx(math.log(eps), rel=1e-2)

    # exact mode: torch's own autograd of log(clamp(x, eps)), including 0 for NaN and g/eps at eps.
    x64 = x.double().requires_grad_(True)
    (want_exact,) = torch.autograd.grad(torch.log(torch.clamp(x64, min=eps)), x64, g.double())
    xe = x.clone().requires_grad_(True)
    (got_exact,) = torch.autograd.grad(fastops.clipped_log(xe, eps, straight_through=False), xe, g)
    assert_close_to_reference(got_exact, want_exact, rtol=1e-2 if dtype != torch.float32 else None)
    assert got_exact[0] == 0 and got_exact[5].item() == pytest.approx(3.0 / eps)

    # straight-through: g / clamp(x, eps) everywhere (NaN stays NaN, below eps gets g / eps).
    xs = x.clone().requires_grad_(True)
    (got_st,) = torch.autograd.grad(fastops.clipped_log(xs, eps, straight_through=True), xs, g)
    want_st = g.double() / torch.clamp(x.double(), min=eps)
    assert_close_to_reference(got_st, want_st, rtol=1e-2 if dtype != torch.float32 else None)
    assert (
        torch.isnan(got_st[0])
        and got_st[6].item() == pytest.approx(1.0 / eps)
        and got_st[7].item() == pytest.approx(1.0 / eps)
    )


def test_fp16_tiny_eps_is_held_in_fp32() -> None:
    """Documented difference: eps=1e-8 underflows to 0 in eager fp16 (log -> -inf), not in ours."""
    x = torch.zeros(4, dtype=torch.float16)
    ours = fastops.clipped_log(x, eps=1e-8)
    assert ours.dtype == torch.float16
    assert torch.allclose(ours.float(), torch.full((4,), math.log(1e-8)), atol=2e-2)
    assert torch.isinf(torch.log(torch.clamp(x, min=1e-8))).all()


# ---- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64])
def test_rejects_non_float_dtypes(dtype: torch.dtype) -> None:
    x = torch.ones(3, dtype=dtype)
    with pytest.raises(TypeError, match=r"fastops\.clipped_log: expected x to be a float32"):
        fastops.clipped_log(x)
    with pytest.raises(RuntimeError, match=r"fastops\.clipped_log: expected x"):
        torch.ops.fastops.clipped_log(x, 1e-6, True)


@pytest.mark.parametrize("eps", [0.0, -1e-6, math.nan, math.inf])
def test_rejects_bad_eps(eps: float) -> None:
    with pytest.raises(ValueError, match=r"fastops\.clipped_log: expected eps to be a finite number > 0"):
        fastops.clipped_log(torch.ones(3), eps)
    with pytest.raises(RuntimeError, match=r"fastops\.clipped_log: expected eps"):
        torch.ops.fastops.clipped_log(torch.ones(3), eps, True)


@pytest.mark.parametrize(
    ("dtype", "eps"),
    [(torch.float32, 1e39), (torch.bfloat16, 1e39), (torch.float32, 1e-46), (torch.float16, 1e-46)],
    ids=["fp32-overflow", "bf16-overflow", "fp32-underflow", "fp16-underflow"],
)
def test_rejects_eps_outside_the_compute_type(dtype: torch.dtype, eps: float) -> None:
    """eps is held in float32 for fp32/fp16/bf16 input: 1e39 would be +inf (every output +inf) and
    1e-46 would be 0 (log 0 = -inf). float64 input holds it in float64, where both are fine."""
    x = torch.rand(5, dtype=dtype)
    with pytest.raises(ValueError, match=r"fastops\.clipped_log: eps=.* does not fit torch\.float32"):
        fastops.clipped_log(x, eps)
    # A compiled call raises it too, from the kernel its graph runs (the fake kernel needs no eps).
    torch._dynamo.reset()
    with pytest.raises(ValueError, match=r"fastops\.clipped_log: eps=.* does not fit torch\.float32"):
        torch.compile(fastops.clipped_log, fullgraph=True)(x, eps)
    # The C++ kernels check it (the one check; the Python face passes eps on): a direct call raises
    # the same error, a RuntimeError too.
    with pytest.raises(RuntimeError, match=r"fastops\.clipped_log: eps=.* does not fit torch\.float32"):
        torch.ops.fastops.clipped_log.default(x, eps, True)
    with pytest.raises(
        RuntimeError, match=r"fastops\.clipped_log_backward: eps=.* does not fit torch\.float32"
    ):
        torch.ops.fastops.clipped_log_backward.default(torch.ones_like(x), x, eps, False)
    x64 = torch.rand(5, dtype=torch.float64)
    torch.testing.assert_close(fastops.clipped_log(x64, eps), torch.log(torch.clamp(x64, min=eps)))


def test_rejects_non_tensor_and_non_number() -> None:
    with pytest.raises(TypeError, match=r"fastops\.clipped_log: expected x to be a torch\.Tensor"):
        fastops.clipped_log([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fastops\.clipped_log: expected eps to be a real number"):
        fastops.clipped_log(torch.ones(3), "1e-6")  # type: ignore[arg-type]


def test_backward_op_checks_shapes() -> None:
    with pytest.raises(RuntimeError, match=r"clipped_log_backward: expected grad_out to have the shape of x"):
        torch.ops.fastops.clipped_log_backward(torch.ones(3), torch.ones(4), 1e-6, True)
    with pytest.raises(RuntimeError, match=r"clipped_log_backward: expected grad_out to have the dtype of x"):
        torch.ops.fastops.clipped_log_backward(torch.ones(3, dtype=torch.float64), torch.ones(3), 1e-6, True)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
def test_cuda_rejects_float64_and_device_mismatch() -> None:
    with pytest.raises(TypeError, match=r"fastops\.clipped_log: expected x"):
        fastops.clipped_log(torch.ones(3, dtype=torch.float64, device="cuda"))
    with pytest.raises(RuntimeError, match=r"clipped_log_backward: expected grad_out on the same device"):
        torch.ops.fastops.clipped_log_backward(torch.ones(3), torch.ones(3, device="cuda"), 1e-6, True)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
def test_cuda_large_tensor_tail_and_unaligned() -> None:
    n = (1 << 22) + 5
    base = torch.rand(n + 1, device="cuda") - 0.1
    for x in (base[:n], base[1:]):  # aligned with a tail, and 4 bytes off 16-byte alignment
        torch.testing.assert_close(fastops.clipped_log(x), torch.log(torch.clamp(x, min=1e-6)))


@pytest.mark.large
@cuda_only
def test_cuda_more_than_2_31_elements() -> None:
    """Forward and backward on a bf16 tensor past 2^31 elements, against float64 at the start, across
    element 2^31 and at the tail."""
    eps = _eps_for(torch.bfloat16)
    x = torch.rand(LARGE_NUMEL, device="cuda", dtype=torch.bfloat16) * 4 - 1  # a quarter below eps
    g = torch.randn_like(x)
    y = fastops.clipped_log(x, eps)
    dx = torch.ops.fastops.clipped_log_backward(g, x, eps, True)
    for s in spot_slices(x.numel()):
        x64 = x[s].double().requires_grad_(True)
        y64 = reference.clipped_log(x64, eps)
        (dx64,) = torch.autograd.grad(y64, x64, g[s].double())
        clamped = torch.clamp(x[s], min=eps)
        assert_close_to_reference(y[s], y64.detach(), eager=torch.log(clamped))
        assert_close_to_reference(dx[s], dx64, eager=g[s] / clamped, factor=3.0)
