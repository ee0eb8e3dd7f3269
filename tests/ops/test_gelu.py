"""fastops.gelu / fastops.bias_gelu against their float64 references, on every device, dtype and layout."""

from __future__ import annotations

import math

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

FORMS = pytest.mark.parametrize("approximate", ["none", "tanh"])
HALF = (torch.float16, torch.bfloat16)


def _sample(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    """N(0, 3^2) values plus a share of deep negative-tail values and exact zeros."""
    x = torch.randn(shape, dtype=torch.float64) * 3
    if x.numel():
        flat = x.view(-1)
        flat[::7] = -5 - 7 * torch.rand(flat[::7].shape, dtype=torch.float64)  # [-12, -5]
        flat[3::11] = 0.0
    return x.to(dtype=dtype, device=device)


def _upstream(y: torch.Tensor) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(y.shape, dtype=torch.float64, generator=gen).to(dtype=y.dtype, device=y.device)


def _grads(fn, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:  # noqa: ANN001
    """fn(*inputs), the gradients of every input for a fixed random upstream gradient, and that gradient."""
    leaves = [t.detach().requires_grad_(True) for t in inputs]
    y = fn(*leaves)
    g = _upstream(y)
    grads = list(torch.autograd.grad(y, leaves, g)) if y.numel() else [torch.zeros_like(t) for t in leaves]
    return y.detach(), grads, g


def _check(
    actual: torch.Tensor, ref64: torch.Tensor, eager: torch.Tensor | None, factor: float, what: str
) -> None:
    try:
        assert_close_to_reference(actual, ref64, eager=eager, factor=factor)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


# ---- gelu -----------------------------------------------------------------------------------------


@devices
@dtypes
@FORMS
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_gelu_matches_reference(
    device: str, dtype: torch.dtype, approximate: str, shape: tuple[int, ...]
) -> None:
    base = _sample(shape, dtype, device)
    for layout, x in layouts(base):
        y, (grad_x,), g = _grads(lambda t: fastops.gelu(t, approximate), x)
        x64 = x.detach().double().requires_grad_(True)
        y64 = reference.gelu(x64, approximate)
        (grad64,) = torch.autograd.grad(y64, x64, g.double()) if y64.numel() else (torch.zeros_like(x64),)
        y64 = y64.detach()
        eager_y = eager_g = None
        if dtype in HALF:
            eager_y, (eager_g,), _ = _grads(lambda t: F.gelu(t, approximate=approximate), x)
        assert y.dtype == dtype and y.shape == x.shape
        _check(y, y64, eager_y, 2.0, f"layout {layout}, forward")
        _check(grad_x, grad64, eager_g, 3.0, f"layout {layout}, grad_x")


@devices
def test_gelu_output_keeps_dense_layout(device: str) -> None:
    x = torch.randn(2, 3, 4, 5, device=device).contiguous(memory_format=torch.channels_last)
    assert fastops.gelu(x).stride() == x.stride()
    t = torch.randn(6, 7, device=device).t()
    assert fastops.gelu(t, "tanh").stride() == t.stride()


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


@FORMS
def test_gelu_gradcheck(approximate: str) -> None:
    x = (torch.randn(40, dtype=torch.float64) * 3).view(-1, 5).t().requires_grad_(True)  # a transposed view
    fn = lambda t: fastops.gelu(t, approximate)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


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


@devices
@FORMS
def test_gelu_opcheck(device: str, approximate: str) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for shape in [(5,), (3, 4), (2, 3, 4, 5), (0, 3)]:
            x = (torch.randn(shape, dtype=dtype, device=device) * 2).requires_grad_(True)
            torch.library.opcheck(torch.ops.fastops.gelu.default, (x, approximate))
            g = torch.randn(shape, dtype=dtype, device=device)
            torch.library.opcheck(torch.ops.fastops.gelu_backward.default, (g, x.detach(), approximate))


@devices
def test_gelu_autocast_keeps_input_dtype(device: str) -> None:
    half = torch.bfloat16 if device == "cpu" else torch.float16
    for dtype in (torch.float32, half):
        x = torch.randn(8, 9, device=device, dtype=dtype)
        with torch.autocast(device_type=device, dtype=half):
            y = fastops.gelu(x)
            want = F.gelu(x)
        assert y.dtype == want.dtype == dtype


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


# ---- bias_gelu ------------------------------------------------------------------------------------


def _bias_layouts(t: torch.Tensor):  # noqa: ANN202
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
    (2, 3, 16),
    (2, 3, 4, 5),
    (300, 1100),
    (0, 6),
    (2, 0, 5),
    (3, 0),
]


@devices
@dtypes
@FORMS
@pytest.mark.parametrize("shape", BIAS_SHAPES, ids=str)
def test_bias_gelu_matches_reference(
    device: str, dtype: torch.dtype, approximate: str, shape: tuple[int, ...]
) -> None:
    base = _sample(shape, dtype, device)
    bias = (torch.randn(shape[-1], dtype=torch.float64) * 2).to(dtype=dtype, device=device)
    for layout, x in _bias_layouts(base):
        y, (grad_x, grad_b), g = _grads(lambda t, b: fastops.bias_gelu(t, b, approximate), x, bias)
        x64, b64 = x.detach().double().requires_grad_(True), bias.detach().double().requires_grad_(True)
        y64 = reference.bias_gelu(x64, b64, approximate)
        if y64.numel():
            grad64, gradb64 = torch.autograd.grad(y64, (x64, b64), g.double())
        else:
            grad64, gradb64 = torch.zeros_like(x64), torch.zeros_like(b64)
        eager = [None, None, None]
        if dtype in HALF:
            ey, (eg, egb), _ = _grads(lambda t, b: F.gelu(t + b, approximate=approximate), x, bias)
            eager = [ey, eg, egb]
        assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
        assert grad_b.shape == bias.shape and grad_b.dtype == dtype
        _check(y, y64.detach(), eager[0], 2.0, f"layout {layout}, forward")
        _check(grad_x, grad64, eager[1], 3.0, f"layout {layout}, grad_x")
        if dtype == torch.float32:  # a sum over up to 300 rows: fp32 accumulation error grows with it
            assert_close_to_reference(grad_b, gradb64, rtol=1e-5, atol=1e-4)
        else:
            _check(grad_b, gradb64, eager[2], 3.0, f"layout {layout}, grad_bias")


@devices
def test_bias_gelu_broadcast_and_noncontiguous_x(device: str) -> None:
    for shape in [(6, 10), (2, 3, 10), (2, 3, 4, 10)]:
        x = torch.randn(*shape[:-1], 2 * shape[-1], device=device)[..., ::2]  # last dim strided
        b = torch.randn(shape[-1], device=device)
        torch.testing.assert_close(fastops.bias_gelu(x, b), F.gelu(x + b))
        xt = torch.randn(shape[::-1], device=device).transpose(0, -1)
        bt = torch.randn(xt.shape[-1], device=device)
        torch.testing.assert_close(fastops.bias_gelu(xt, bt, "tanh"), F.gelu(xt + bt, approximate="tanh"))


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


@FORMS
def test_bias_gelu_gradcheck(approximate: str) -> None:
    x = (torch.randn(3, 4, 6, dtype=torch.float64) * 2).requires_grad_(True)
    b = torch.randn(6, dtype=torch.float64).requires_grad_(True)
    fn = lambda t, bb: fastops.bias_gelu(t, bb, approximate)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, b))
    assert torch.autograd.gradgradcheck(fn, (x, b))


@devices
@FORMS
def test_bias_gelu_opcheck(device: str, approximate: str) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        for shape in [(5,), (3, 4), (2, 3, 4, 5), (0, 3)]:
            x = (torch.randn(shape, dtype=dtype, device=device) * 2).requires_grad_(True)
            b = torch.randn(shape[-1], dtype=dtype, device=device).requires_grad_(True)
            torch.library.opcheck(torch.ops.fastops.bias_gelu.default, (x, b, approximate))
            g = torch.randn(shape, dtype=dtype, device=device)
            torch.library.opcheck(
                torch.ops.fastops.bias_gelu_backward.default, (g, x.detach(), b.detach(), approximate)
            )


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


# ---- compile, devices ------------------------------------------------------------------------------


@devices
def test_torch_compile_fullgraph(device: str) -> None:
    def f(t: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (fastops.gelu(t, "tanh") * 2 + fastops.bias_gelu(t, b)).sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=False)
    x = torch.randn(64, 33, device=device).requires_grad_(True)
    b = torch.randn(33, device=device).requires_grad_(True)
    x_ref, b_ref = x.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    compiled(x, b).backward()
    f(x_ref, b_ref).backward()
    torch.testing.assert_close(compiled(x.detach(), b.detach()), f(x_ref.detach(), b_ref.detach()))
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(b.grad, b_ref.grad)


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


@devices
@dtypes
def test_bias_gelu_unaligned_bias(device: str, dtype: torch.dtype) -> None:
    """x 16-byte aligned with a vector-multiple row, bias one element off alignment: the kernels must
    take the element path for the whole launch (the vector path would read bias misaligned)."""
    x = _sample((37, 64), dtype, device)
    storage = torch.randn(65, dtype=torch.float64).to(dtype=dtype, device=device)
    bias = storage[1:]
    assert x.data_ptr() % 16 == 0 and bias.data_ptr() % 16 != 0
    for approximate in ("none", "tanh"):
        y, (grad_x, grad_b), g = _grads(lambda t, b: fastops.bias_gelu(t, b, approximate), x, bias)  # noqa: B023
        x64, b64 = x.double().requires_grad_(True), bias.double().requires_grad_(True)
        y64 = reference.bias_gelu(x64, b64, approximate)
        grad64, gradb64 = torch.autograd.grad(y64, (x64, b64), g.double())
        eager = [None, None, None]
        if dtype in HALF:
            ey, (eg, egb), _ = _grads(lambda t, b: F.gelu(t + b, approximate=approximate), x, bias)  # noqa: B023
            eager = [ey, eg, egb]
        _check(y, y64.detach(), eager[0], 2.0, f"{approximate}, forward")
        _check(grad_x, grad64, eager[1], 3.0, f"{approximate}, grad_x")
        if dtype == torch.float32:
            assert_close_to_reference(grad_b, gradb64, rtol=1e-5, atol=1e-4)
        else:
            _check(grad_b, gradb64, eager[2], 3.0, f"{approximate}, grad_bias")


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
        _check(y[s], y64.detach(), F.gelu(x[s]), 2.0, f"gelu forward {s}")
        _check(dx[s], dx64, torch.ops.aten.gelu_backward(g[s], x[s]), 3.0, f"gelu backward {s}")
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
        _check(y[s], y64.detach(), F.gelu(x[s] + bias), 2.0, f"bias_gelu forward rows {s}")
        eager_dx = torch.ops.aten.gelu_backward(g[s], x[s] + bias)
        _check(dx[s], dx64, eager_dx, 3.0, f"bias_gelu grad_x rows {s}")
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
