"""fastops.clipped_log against its float64 reference, on every device, dtype and layout."""

from __future__ import annotations

import math

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

MODES = pytest.mark.parametrize("straight_through", [True, False], ids=["straight", "exact"])


def _eps_for(dtype: torch.dtype) -> float:
    # fp16 cannot hold g / 1e-6; a larger floor keeps the straight-through gradient finite there.
    return 1e-6 if dtype in (torch.float32, torch.float64) else 1e-3


def _sample(shape: tuple[int, ...], dtype: torch.dtype, device: str, eps: float) -> torch.Tensor:
    """Values on both sides of eps: negatives, zeros, tiny positives, ones and large ones."""
    x = torch.randn(shape, dtype=torch.float64) * 3
    if x.numel():
        flat = x.view(-1)
        flat[::5] = eps * torch.rand(flat[::5].shape, dtype=torch.float64)  # just below eps
        flat[1::7] = 0.0
    return x.to(dtype=dtype, device=device)


def _run(
    x: torch.Tensor, eps: float, straight_through: bool, fn
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward and input gradient of fn, with a random upstream gradient of x's dtype."""
    x = x.detach().requires_grad_(True)
    y = fn(x, eps, straight_through)
    g = (
        torch.randn(y.shape, dtype=y.dtype, device=y.device, generator=torch.Generator().manual_seed(1))
        if y.device.type == "cpu"
        else torch.randn_like(y)
    )
    (grad_x,) = torch.autograd.grad(y, x, g) if y.numel() else (torch.zeros_like(x),)
    return y.detach(), grad_x, g


@devices
@dtypes
@MODES
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference(
    device: str, dtype: torch.dtype, straight_through: bool, shape: tuple[int, ...]
) -> None:
    eps = _eps_for(dtype)
    base = _sample(shape, dtype, device, eps)
    for layout, x in layouts(base):
        y, grad_x, g = _run(x, eps, straight_through, fastops.clipped_log)
        # Reference in float64 with eps as the kernel holds it (fp32 for every half/fp32 input).
        eps_held = float(torch.tensor(eps, dtype=torch.float32))
        x64 = x.detach().double().requires_grad_(True)
        y64 = reference.clipped_log(x64, eps_held, straight_through)
        (grad64,) = torch.autograd.grad(y64, x64, g.double()) if y64.numel() else (torch.zeros_like(x64),)
        eager_y = eager_g = None
        if dtype in (torch.float16, torch.bfloat16):
            eager_y, eager_g, _ = _run(x, eps, straight_through, reference.clipped_log)
        try:
            assert y.dtype == dtype and y.shape == x.shape
            assert_close_to_reference(y, y64, eager=eager_y, factor=2.0)
            assert_close_to_reference(grad_x, grad64, eager=eager_g, factor=3.0)
        except AssertionError as e:
            raise AssertionError(f"layout {layout}: {e}") from None


@devices
def test_output_keeps_dense_layout(device: str) -> None:
    x = torch.rand(2, 3, 4, 5, device=device).contiguous(memory_format=torch.channels_last)
    assert fastops.clipped_log(x).stride() == x.stride()
    t = torch.rand(6, 7, device=device).t()
    assert fastops.clipped_log(t).stride() == t.stride()


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


@MODES
def test_gradcheck(straight_through: bool) -> None:
    eps = 1e-3
    # Away from the kink at eps; straight-through is a surrogate below eps, so only x > eps there.
    low = torch.rand(20, dtype=torch.float64) * 0.5 * eps
    high = torch.rand(20, dtype=torch.float64) + 2 * eps
    x = torch.cat([high, low]) if not straight_through else high
    x = x.view(-1, 4).t().requires_grad_(True)  # a transposed view
    fn = lambda t: fastops.clipped_log(t, eps, straight_through)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


@devices
@MODES
def test_opcheck(device: str, straight_through: bool) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for shape in [(5,), (3, 4), (2, 3, 4, 5), (0, 3)]:
            x = (torch.rand(shape, dtype=dtype, device=device) - 0.2).requires_grad_(True)
            torch.library.opcheck(torch.ops.fastops.clipped_log.default, (x, 1e-3, straight_through))
            g = torch.randn(shape, dtype=dtype, device=device)
            torch.library.opcheck(
                torch.ops.fastops.clipped_log_backward.default, (g, x.detach(), 1e-3, straight_through)
            )


@devices
def test_torch_compile_fullgraph(device: str) -> None:
    def f(t: torch.Tensor) -> torch.Tensor:
        return (fastops.clipped_log(t, 1e-4, straight_through=True) * 2).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    x = (torch.rand(64, 33, device=device) - 0.1).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    compiled(x).backward()
    f(x_ref).backward()
    torch.testing.assert_close(compiled(x.detach()), f(x_ref.detach()))
    torch.testing.assert_close(x.grad, x_ref.grad)


@devices
def test_autocast_runs_in_float32(device: str) -> None:
    dtype = torch.bfloat16 if device == "cpu" else torch.float16
    x = torch.rand(8, 9, device=device, dtype=dtype) + 0.01
    with torch.autocast(device_type=device, dtype=dtype):
        y = fastops.clipped_log(x)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, torch.log(torch.clamp(x.float(), min=1e-6)))


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
