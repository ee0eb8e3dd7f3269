"""fastops.depthwise_separable_conv2d (fused depthwise -> 1x1, CPU) against the fp64 reference."""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import fastops
from fastops import reference
from tests.helpers import assert_close_to_reference
from tests.ops.contract import ContractTests, OpSpec, Sample

# (N, C, Cout, H, W, k, stride, dilation, padding)
CASES = [
    (1, 24, 64, 8, 9, 3, 1, 1, 1),  # fp32: 4 vectors of output channels in one register chunk
    (2, 16, 24, 12, 11, 3, 1, 1, 1),
    (1, 17, 9, 13, 13, 3, 2, 1, 1),  # odd C / Cout, batch 1
    (2, 32, 16, 14, 14, 5, 1, 1, 2),
    (1, 24, 33, 15, 16, 5, 2, 1, 2),
    (2, 13, 40, 9, 10, 7, 1, 1, 3),
    (1, 40, 24, 16, 15, 7, 2, 1, 3),
    (2, 8, 8, 9, 9, 3, 1, 2, "same"),
    (1, 5, 3, 6, 7, (2, 3), (1, 2), 1, 0),  # no register-blocked variant: the generic taps
    (3, 96, 24, 7, 7, 3, 1, 1, 1),
    (1, 144, 80, 20, 130, 3, 1, 1, 1),  # a row of several tiles
    (0, 16, 8, 9, 9, 3, 1, 1, 1),  # empty batch
    (2, 4, 6, 3, 3, 5, 1, 1, 2),  # H, W smaller than k
]


def _ids(case: tuple) -> str:
    n, c, co, h, w, k, s, d, p = case
    return f"n{n}c{c}o{co}_{h}x{w}_k{k}s{s}d{d}p{p}"


def _inputs(case: tuple, dtype: torch.dtype, bias: bool = True, channels_last: bool = True):
    n, c, co, h, w, k, _, _, _ = case
    kh, kw = (k, k) if isinstance(k, int) else k
    # crc32, not hash(): a str in the case ("same") hashes differently in every process.
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    x = torch.randn(n, c, h, w, generator=gen, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    dw = torch.randn(c, 1, kh, kw, generator=gen, dtype=torch.float64)
    pw = torch.randn(co, c, 1, 1, generator=gen, dtype=torch.float64) / c**0.5
    db = torch.randn(c, generator=gen, dtype=torch.float64) if bias else None
    pb = torch.randn(co, generator=gen, dtype=torch.float64) if bias else None
    return [t.to(dtype) if t is not None else None for t in (x, dw, db, pw, pb)]


def _forward_backward(fn, inputs, args, g=None):
    leaves = [t.detach().requires_grad_(True) if t is not None else None for t in inputs]
    y = fn(*leaves, *args)
    if g is None:
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(y.dtype)
    used = [t for t in leaves if t is not None]
    grads = torch.autograd.grad(y, used, g) if y.numel() else [torch.zeros_like(t) for t in used]
    return y.detach(), list(grads), g


class _StoredAs(torch.autograd.Function):
    """Identity that rounds its value (forward) and its gradient (backward) to `dtype`: a tensor
    that the computation keeps in `dtype` in memory."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.dtype = dtype
        return t.to(dtype).to(t.dtype)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        return g.to(ctx.dtype).to(g.dtype), None


def _correctly_rounded(x, dw, db, pw, pb, stride, padding, dilation, *, dtype):
    """The reference on float64 inputs, exact except that the depthwise output z and its gradient
    are rounded to `dtype` (as the op's contract and eager's unfused pair keep them): round its
    results to `dtype` and they are what a correctly rounded computation in `dtype` returns."""
    z = _StoredAs.apply(reference.depthwise_conv2d(x, dw, db, stride, padding, dilation), dtype)
    return F.conv2d(z, pw, pb)


def _check(case: tuple, dtype: torch.dtype, bias: bool = True, channels_last: bool = True) -> None:
    args = case[6], case[8], case[7]  # stride, padding, dilation
    inputs = _inputs(case, dtype, bias, channels_last)
    y, grads, g = _forward_backward(fastops.depthwise_separable_conv2d, inputs, args)
    inputs64 = [t.double() if t is not None else None for t in inputs]
    y64, grads64, _ = _forward_backward(reference.depthwise_separable_conv2d, inputs64, args, g.double())
    assert y.dtype == dtype and y.shape == y64.shape
    assert y.is_contiguous(memory_format=torch.channels_last)
    names = [
        n
        for n, t in zip(("grad_x", "grad_dw", "grad_db", "grad_pw", "grad_pb"), inputs, strict=True)
        if t is not None
    ]
    eager_y, eager_grads = None, [None] * len(grads)
    rounded_y, rounded_grads = None, [None] * len(grads)
    if dtype == torch.bfloat16:
        eager_y, eager_grads, _ = _forward_backward(reference.depthwise_separable_conv2d, inputs, args, g)
        # The rule compares with eager elementwise, and eager's error at an element depends on its
        # path: oneDNN's bf16 convs (AVX512) are correctly rounded; ATen's fallback (AVX2-only CPUs)
        # rounds the depthwise backward more often, is worse on average, yet at some elements lands
        # closer than any correctly rounded result. So the bound never goes below `factor` times the
        # error of a correctly rounded computation (what eager returns on the oneDNN path).
        fn = functools.partial(_correctly_rounded, dtype=dtype)
        rounded_y, rounded_grads, _ = _forward_backward(fn, inputs64, args, g.double())
    # fp32: the 1x1 weight gradient sums N*OH*OW products (2600 in the largest case); allow for it.
    tol_out = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {}
    tol_grad = {"rtol": 1e-4, "atol": 5e-4} if dtype == torch.float32 else {}
    for name, ours, ref, eager, rounded in zip(
        ["output", *names],
        [y, *grads],
        [y64, *grads64],
        [eager_y, *eager_grads],
        [rounded_y, *rounded_grads],
        strict=True,
    ):
        factor = 2.0 if name == "output" else 3.0
        try:
            assert_close_to_reference(
                ours,
                ref,
                eager=eager,
                factor=factor,
                floor=None if rounded is None else factor * (rounded.to(dtype).double() - ref).abs(),
                **(tol_out if name == "output" else tol_grad),
            )
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_matches_reference_float64(case: tuple) -> None:
    _check(case, torch.float64)


@pytest.mark.parametrize("case", CASES[::2], ids=_ids)
def test_matches_reference_float32(case: tuple) -> None:
    _check(case, torch.float32)


@pytest.mark.parametrize("case", CASES[1::3], ids=_ids)
def test_matches_reference_bfloat16(case: tuple) -> None:
    _check(case, torch.bfloat16)


def test_no_bias_and_contiguous_input() -> None:
    _check(CASES[1], torch.float64, bias=False)
    _check(CASES[2], torch.float64, channels_last=False)  # converted to channels_last inside


# ---- the contract kit: opcheck, gradcheck, torch.compile, autocast ---------------------------------
# (the reference comparison stays above: its bf16 bound needs the correctly rounded floor)


def _sample(case: tuple, dtype: torch.dtype, requires_grad: bool, bias: bool = True) -> Sample:
    inputs = [t.requires_grad_(requires_grad) if t is not None else None for t in _inputs(case, dtype, bias)]
    _, _, _, _, _, _, stride, dilation, padding = case
    return Sample((*inputs, stride, padding, dilation), id=_ids(case) + ("" if bias else "-nobias"))


def separable_small(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    for stride, padding in ((1, 1), (2, 0)):
        yield _sample((2, 3, 5, 6, 7, 3, stride, 1, padding), dtype, requires_grad)


def separable_compile(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    yield _sample((2, 6, 10, 11, 10, 3, 2, 1, 1), dtype, requires_grad)


def separable_opcheck(device: str, dtype: torch.dtype) -> Iterator[tuple]:
    x = (
        torch.randn(2, 5, 9, 8, dtype=dtype)
        .contiguous(memory_format=torch.channels_last)
        .requires_grad_(True)
    )
    dw = torch.randn(5, 1, 3, 3, dtype=dtype, requires_grad=True)
    db = torch.randn(5, dtype=dtype, requires_grad=True)
    pw = torch.randn(7, 5, 1, 1, dtype=dtype, requires_grad=True)
    pb = torch.randn(7, dtype=dtype, requires_grad=True)
    args = ([2, 1], [1, 1, 0, 2], [1, 2])
    op = torch.ops.fastops.depthwise_separable_conv2d.default
    yield op, (x, dw, db, pw, pb, *args)
    yield op, (x, dw, None, pw, None, *args)


DEPTHWISE_SEPARABLE_CONV2D = OpSpec(
    name="depthwise_separable_conv2d",
    op=fastops.depthwise_separable_conv2d,
    reference=reference.depthwise_separable_conv2d,
    sample_inputs=lambda device, dtype, requires_grad: iter(()),  # the reference check is _check above
    small_inputs=separable_small,
    compile_inputs=separable_compile,
    opcheck_inputs=separable_opcheck,
    devices=("cpu",),  # no CUDA kernel
    autocast="autocast",
    output_format="channels_last",
    checks=("opcheck", "gradcheck", "compile", "autocast"),
)


class TestDepthwiseSeparableConv2dContract(ContractTests):
    spec = DEPTHWISE_SEPARABLE_CONV2D


def test_clear_errors() -> None:
    x, dw, db, pw, pb = _inputs(CASES[1], torch.float32)  # C=16, Cout=24
    f = fastops.depthwise_separable_conv2d
    with pytest.raises(ValueError, match=r"depthwise_separable_conv2d: expected x to be 4-D"):
        f(x[0], dw, db, pw, pb)
    with pytest.raises(ValueError, match=r"expected dw_weight of shape \(16, 1, kh, kw\)"):
        f(x, dw[:3], db, pw, pb)
    with pytest.raises(ValueError, match=r"expected pw_weight of shape \(Cout, 16, 1, 1\)"):
        f(x, dw, db, pw[:, :4], pb)
    with pytest.raises(ValueError, match=r"expected pw_bias of shape \(24,\)"):
        f(x, dw, db, pw, pb[:3])
    with pytest.raises(ValueError, match=r"expected dw_bias of shape \(16,\)"):
        f(x, dw, db[:3], pw, pb)
    with pytest.raises(TypeError, match=r"expected x to be a torch.Tensor"):
        f(None, dw, db, pw, pb)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"padding='same' is not supported for strided"):
        f(x, dw, db, pw, pb, 2, "same")
    op = torch.ops.fastops.depthwise_separable_conv2d
    with pytest.raises(
        RuntimeError, match=r"depthwise_separable_conv2d: expected pw_weight of shape \(Cout, 16, 1, 1\)"
    ):
        op(x, dw, db, pw[:, :4], pb, [1, 1], [1, 1, 1, 1], [1, 1])
    with pytest.raises(
        RuntimeError, match=r"depthwise_separable_conv2d: expected pw_weight to have the dtype"
    ):
        op(x, dw, db, pw.double(), pb, [1, 1], [1, 1, 1, 1], [1, 1])
    with pytest.raises(RuntimeError, match=r"depthwise_separable_conv2d: expected pw_bias of shape \(24,\)"):
        op(x, dw, db, pw, pb[:3], [1, 1], [1, 1, 1, 1], [1, 1])
    with pytest.raises(RuntimeError, match=r"is smaller than the dilated kernel"):
        op(x, dw, db, pw, pb, [1, 1], [0, 0, 0, 0], [7, 7])


def test_autocast_takes_a_low_precision_x_with_fp32_weights() -> None:
    x = torch.randn(2, 4, 8, 8).bfloat16().contiguous(memory_format=torch.channels_last)
    dw_w, dw_b, pw_w, pw_b = torch.randn(4, 1, 3, 3), torch.randn(4), torch.randn(6, 4, 1, 1), torch.randn(6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = fastops.depthwise_separable_conv2d(x, dw_w, dw_b, pw_w, pw_b, padding=1)
        eager = torch.nn.functional.conv2d(
            torch.nn.functional.conv2d(x, dw_w, dw_b, padding=1, groups=4), pw_w, pw_b
        )
    assert ours.dtype == eager.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), eager.float(), rtol=3e-2, atol=3e-2)
    with pytest.raises(TypeError, match=r"expected dw_weight to have the dtype of x \(torch.bfloat16\)"):
        fastops.depthwise_separable_conv2d(x, dw_w, dw_b, pw_w, pw_b, padding=1)
