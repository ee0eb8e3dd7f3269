"""fastops.batch_norm: its contract spec, and the edge cases of its own (running statistics, special
values, determinism, errors)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import fastops
from fastops import reference
from tests.helpers import DEVICES, devices, dtypes, layouts
from tests.ops.contract import ContractTests, OpSpec, Sample

# (N, C, ...): planes of several sizes (odd, a whole vector, under a vector, 1x1), rows (2-D), 3-D, and
# an empty batch.
BN_SHAPES = [
    (2, 3),
    (7, 20),
    (3, 4, 10),
    (4, 3, 5, 7),
    (2, 16, 1, 1),
    (8, 33, 3, 3),
    (3, 70, 9, 9),
    (2, 5, 17, 4),
    # Channels past one strip of 8 vectors (the rows kernels walk C in strips), fp32 and fp64.
    (2, 150, 3, 3),
    (3, 300),
]
EMPTY_SHAPES = [(0, 3, 4, 4)]


def _per_channel(c: int, dtype: torch.dtype, device: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "weight": (torch.randn(c, generator=gen, dtype=torch.float64) + 1).to(device, dtype),
        "bias": torch.randn(c, generator=gen, dtype=torch.float64).to(device, dtype),
        "running_mean": torch.randn(c, generator=gen, dtype=torch.float64).to(device, dtype),
        "running_var": (torch.rand(c, generator=gen, dtype=torch.float64) + 0.5).to(device, dtype),
    }


def batch_norm_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    """Every shape in every layout of `layouts`, training and eval, affine or not, with per-channel
    tensors in x's dtype and (for fp16/bf16 x) in float32, as under autocast."""
    gen = torch.Generator().manual_seed(0)
    param_dtypes = [dtype] + ([torch.float32] if dtype in (torch.float16, torch.bfloat16) else [])
    for shape in BN_SHAPES + EMPTY_SHAPES:
        base = (torch.randn(shape, generator=gen, dtype=torch.float64) * 2 + 3).to(device, dtype)
        for layout, x in layouts(base):
            if x.dim() < 2:
                continue
            for training in (True, False):
                if training and x.numel() and x.numel() // x.shape[1] <= 1:
                    continue
                for param_dtype in param_dtypes:
                    p = _per_channel(x.shape[1], param_dtype, device, gen)
                    affine = param_dtype == dtype or layout == "contiguous"
                    weight = p["weight"].requires_grad_(requires_grad) if affine else None
                    bias = p["bias"].requires_grad_(requires_grad) if affine else None
                    x = x.detach().requires_grad_(requires_grad)
                    yield Sample(
                        (x, p["running_mean"], p["running_var"], weight, bias, training, 0.1, 1e-5),
                        id=f"{shape}-{layout}-{'train' if training else 'eval'}-{param_dtype}-affine{affine}",
                    )


def batch_norm_small(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    gen = torch.Generator().manual_seed(1)
    for shape, training in [((3, 4, 5), True), ((2, 3, 2, 3), True), ((4, 3), False)]:
        x = (
            torch.randn(shape, generator=gen, dtype=torch.float64)
            .to(device, dtype)
            .requires_grad_(requires_grad)
        )
        p = _per_channel(shape[1], dtype, device, gen)
        yield Sample(
            (
                x,
                p["running_mean"],
                p["running_var"],
                p["weight"].requires_grad_(requires_grad),
                p["bias"].requires_grad_(requires_grad),
                training,
                0.1,
                1e-3,
            ),
            id=f"{shape}-{'train' if training else 'eval'}",
        )


def batch_norm_opcheck(device: str, dtype: torch.dtype) -> Iterator[tuple]:
    gen = torch.Generator().manual_seed(2)
    for shape in [(3, 4, 5), (2, 5, 3, 3), (6, 8)]:
        x = torch.randn(shape, generator=gen).to(device, dtype)
        p = _per_channel(shape[1], torch.float32, device, gen)
        w, b = p["weight"].requires_grad_(True), p["bias"].requires_grad_(True)
        for training in (True, False):
            args = (x.requires_grad_(True), w, b, p["running_mean"], p["running_var"], training, 1e-5)
            yield torch.ops.fastops.batch_norm.default, args
            _, mean, invstd, _ = torch.ops.fastops.batch_norm.default(*args)
            g = torch.randn(shape, generator=gen).to(device, dtype)
            for input_grad in (True, False):
                yield (
                    torch.ops.fastops.batch_norm_backward.default,
                    (g, x.detach(), w.detach(), mean, invstd, training, input_grad),
                )
        xc = torch.randn(2, 5, 3, 3, generator=gen).to(device, dtype).to(memory_format=torch.channels_last)
        yield torch.ops.fastops.batch_norm.default, (xc, None, None, None, None, True, 1e-5)


BATCH_NORM = OpSpec(
    name="batch_norm",
    op=fastops.batch_norm,
    reference=reference.batch_norm,
    sample_inputs=batch_norm_samples,
    small_inputs=batch_norm_small,
    opcheck_inputs=batch_norm_opcheck,
    autocast="input",
    output_format="memory_format_of_input",
    # dx subtracts the channel's mean gradient and its projection on x - mean: sums of up to 1200
    # terms, then a difference; grad_weight / grad_bias are such sums themselves.
    fp32_tolerances={"grad": (1e-5, 1e-5)},
)


class TestBatchNormContract(ContractTests):
    spec = BATCH_NORM


@pytest.mark.parametrize("given", ["weight", "bias", "neither"])
@pytest.mark.parametrize("with_running", [False, True])
def test_gradients_with_only_some_per_channel_tensors(given: str, with_running: bool) -> None:
    """The autograd node's slots count defined tensors only: a weight without bias (and the reverse),
    with or without running statistics, still sends each gradient to its own tensor."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(6, 4, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    p = _per_channel(4, torch.float64, "cpu", gen)
    weight = p["weight"].requires_grad_() if given == "weight" else None
    bias = p["bias"].requires_grad_() if given == "bias" else None
    stats = (p["running_mean"], p["running_var"]) if with_running else (None, None)
    leaves = [t for t in (x, weight, bias) if t is not None]
    assert torch.autograd.gradcheck(
        lambda *t: fastops.batch_norm(t[0], *stats, *_place(given, t[1:]), True), leaves
    )


def _place(given: str, rest: tuple) -> tuple:
    """(weight, bias) from the leaves after x."""
    if given == "weight":
        return rest[0], None
    if given == "bias":
        return None, rest[0]
    return None, None


# ---- double backward -----------------------------------------------------------------------------------


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("given", ["weight", "bias", "neither"])
def test_gradgradcheck(training: bool, given: str) -> None:
    """Second derivatives (gradient penalties, Hessian-vector products) in float64, numerically."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 4, 3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    p = _per_channel(4, torch.float64, "cpu", gen)
    weight = p["weight"].requires_grad_() if given == "weight" else None
    bias = p["bias"].requires_grad_() if given == "bias" else None
    leaves = [t for t in (x, weight, bias) if t is not None]

    def fn(*t: torch.Tensor) -> torch.Tensor:
        stats = (p["running_mean"].clone(), p["running_var"].clone())
        return fastops.batch_norm(t[0], *stats, *_place(given, t[1:]), training)

    assert torch.autograd.gradgradcheck(fn, leaves)


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_double_backward_matches_aten_in_float32(training: bool, channels_last: bool) -> None:
    """The gradient of a gradient, as a gradient penalty takes it, against float64 aten (it was all
    zeros with only a UserWarning)."""
    gen = torch.Generator().manual_seed(4)
    x64 = torch.randn(4, 3, 5, 5, generator=gen, dtype=torch.float64)
    p = _per_channel(3, torch.float64, "cpu", gen)
    results = []
    for fn, dtype in ((fastops.batch_norm, torch.float32), (F.batch_norm, torch.float64)):
        x = x64.to(dtype)
        x = (x.contiguous(memory_format=torch.channels_last) if channels_last else x).requires_grad_()
        w, b = p["weight"].to(dtype).requires_grad_(), p["bias"].to(dtype).requires_grad_()
        stats = (p["running_mean"].to(dtype), p["running_var"].to(dtype))
        y = fn(x, *stats, w, b, training, 0.1, 1e-5)
        (g,) = torch.autograd.grad(y.pow(3).sum(), x, create_graph=True)
        results.append(torch.autograd.grad(g.pow(2).sum(), (x, w, b)))
    scale = results[1][0].abs().max().item()  # the input gradient's: the bias's is ~0 in training
    assert scale > 1
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5 * scale)


# ---- running statistics ------------------------------------------------------------------------------


@devices
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("momentum", [0.1, 0.7, 1.5, -0.25])  # any number, as aten takes it
def test_running_statistics_follow_aten(device: str, channels_last: bool, momentum: float) -> None:
    """Three training steps update running_mean / running_var (unbiased) as F.batch_norm does."""
    gen = torch.Generator().manual_seed(3)
    ours = _per_channel(6, torch.float32, device, gen)
    theirs = {k: v.clone() for k, v in ours.items()}
    for _ in range(3):
        x = (torch.randn(5, 6, 7, 3, generator=gen) * 4 + 2).to(device)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        y = fastops.batch_norm(
            x, ours["running_mean"], ours["running_var"], ours["weight"], ours["bias"], True, momentum
        )
        want = F.batch_norm(
            x, theirs["running_mean"], theirs["running_var"], theirs["weight"], theirs["bias"], True, momentum
        )
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours["running_mean"], theirs["running_mean"])
    torch.testing.assert_close(ours["running_var"], theirs["running_var"])


def test_half_input_updates_float32_statistics() -> None:
    """Under autocast a bf16 activation meets float32 statistics: they stay float32 and are updated."""
    gen = torch.Generator().manual_seed(4)
    p = _per_channel(4, torch.float32, "cpu", gen)
    before = p["running_mean"].clone()
    x = torch.randn(8, 4, 5, 5, generator=gen).to(torch.bfloat16)
    y = fastops.batch_norm(x, p["running_mean"], p["running_var"], p["weight"], p["bias"], True)
    assert y.dtype == torch.bfloat16 and p["running_mean"].dtype == torch.float32
    torch.testing.assert_close(p["running_mean"], 0.9 * before + 0.1 * x.float().mean((0, 2, 3)))


def test_empty_batch_leaves_running_statistics() -> None:
    gen = torch.Generator().manual_seed(5)
    p = _per_channel(3, torch.float32, "cpu", gen)
    before = {k: v.clone() for k, v in p.items()}
    y = fastops.batch_norm(torch.empty(0, 3, 4, 4), p["running_mean"], p["running_var"], training=True)
    assert y.shape == (0, 3, 4, 4)
    for k in ("running_mean", "running_var"):
        torch.testing.assert_close(p[k], before[k])


def test_statistics_of_values_far_from_zero() -> None:
    """The variance is summed as squared deviations from each plane's (block's) mean, not as
    E[x^2] - E[x]^2: values 1e4 away from zero with spread 1e-2 keep their variance in float32."""
    gen = torch.Generator().manual_seed(6)
    for channels_last in (False, True):
        x64 = torch.randn(16, 8, 12, 12, generator=gen, dtype=torch.float64) * 1e-2 + 1e4
        x = x64.float()
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        _, mean, invstd, var = torch.ops.fastops.batch_norm.default(x, None, None, None, None, True, 1e-12)
        want_var = x.double().var((0, 2, 3))
        torch.testing.assert_close(var.double(), want_var, rtol=1e-4, atol=0)
        torch.testing.assert_close(
            invstd.double(), 1 / (x.double().var((0, 2, 3), unbiased=False) + 1e-12).sqrt(), rtol=1e-4, atol=0
        )


def test_no_channels_is_an_error() -> None:
    """aten's batch_norm fails with an IndexError on zero channels; ours says what is wrong."""
    x = torch.randn(2, 0, 3, 3)
    with pytest.raises(ValueError, match=r"fastops\.batch_norm: expected x to have .* at least one channel"):
        fastops.batch_norm(x, None, None, training=True)
    with pytest.raises(
        RuntimeError, match=r"fastops\.batch_norm: expected x to have .* at least one channel"
    ):
        torch.ops.fastops.batch_norm(x, None, None, None, None, True, 1e-5)


# ---- special values and determinism -----------------------------------------------------------------


@devices
@dtypes
def test_nan_and_inf_stay_in_their_channel(device: str, dtype: torch.dtype) -> None:
    """A NaN (or inf) makes its own channel's statistics and outputs NaN, as aten's; the other
    channels are untouched."""
    for layout in ("nchw", "nhwc"):
        x = torch.randn(4, 3, 5, 5, dtype=torch.float64).to(device, dtype)
        x[1, 0, 2, 2] = math.nan
        x[2, 2, 0, 1] = math.inf
        if layout == "nhwc":
            x = x.to(memory_format=torch.channels_last)
        y = fastops.batch_norm(x, None, None, training=True)
        assert torch.isnan(y[:, 0]).all() and torch.isnan(y[:, 2]).all()
        want = F.batch_norm(x[:, 1:2].float(), None, None, training=True)
        torch.testing.assert_close(y[:, 1:2].float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", [(16, 24, 9, 9), (600, 40)], ids=["planes", "rows"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_bitwise_the_same_for_any_thread_count(shape: tuple[int, ...], channels_last: bool) -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(shape, generator=gen)
    if channels_last:
        if x.dim() != 4:
            pytest.skip("channels_last is 4-D")
        x = x.to(memory_format=torch.channels_last)
    g = torch.randn(shape, generator=gen)
    w = torch.randn(shape[1], generator=gen)
    threads = torch.get_num_threads()
    results = []
    try:
        for n in (1, max(2, threads)):
            torch.set_num_threads(n)
            _, mean, invstd, var = torch.ops.fastops.batch_norm.default(x, w, None, None, None, True, 1e-5)
            grads = torch.ops.fastops.batch_norm_backward.default(g, x, w, mean, invstd, True, True)
            results.append((mean, invstd, var, *grads))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


# ---- errors ------------------------------------------------------------------------------------------


def test_rejects_bad_arguments() -> None:
    x = torch.randn(4, 3, 5, 5)
    c3 = torch.ones(3)
    with pytest.raises(TypeError, match=r"fastops\.batch_norm: expected x to be a torch\.Tensor"):
        fastops.batch_norm([1.0], None, None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fastops\.batch_norm: expected x to be a float32"):
        fastops.batch_norm(x.int(), c3, c3)
    with pytest.raises(ValueError, match=r"fastops\.batch_norm: expected x to have at least 2 dims"):
        fastops.batch_norm(torch.ones(5), None, None, training=True)
    with pytest.raises(ValueError, match=r"fastops\.batch_norm: expected weight of shape \[3\]"):
        fastops.batch_norm(x, c3, c3, torch.ones(4))
    with pytest.raises(TypeError, match=r"fastops\.batch_norm: expected bias to be torch\.float32 \(x is"):
        fastops.batch_norm(x, c3, c3, c3, torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"fastops\.batch_norm: expected running_mean and running_var"):
        fastops.batch_norm(x, None, None, training=False)
    with pytest.raises(ValueError, match=r"fastops\.batch_norm: expected more than 1 value per channel"):
        fastops.batch_norm(torch.ones(1, 3, 1, 1), None, None, training=True)
    with pytest.raises(ValueError, match=r"fastops\.batch_norm: expected eps to be a finite number > 0"):
        fastops.batch_norm(x, c3, c3, eps=0.0)
    with pytest.raises(ValueError, match=r"fastops\.batch_norm: eps=.* does not fit torch\.float32"):
        fastops.batch_norm(x, c3, c3, eps=1e39)
    for stats in ((c3.clone(), None), (None, c3.clone())):  # F.batch_norm refuses these too
        for training in (True, False):
            with pytest.raises(
                ValueError, match=r"fastops\.batch_norm: expected running_mean and running_var"
            ):
                fastops.batch_norm(x, *stats, training=training)
    with pytest.raises(TypeError, match=r"fastops\.batch_norm: expected momentum to be a real number"):
        fastops.batch_norm(x, c3, c3.clone(), training=True, momentum="0.1")  # type: ignore[arg-type]
    # A compiled call raises the same error, from the kernel its graph runs (the fake kernel checks
    # only what it needs to shape the outputs).
    torch._dynamo.reset()
    with pytest.raises(ValueError, match=r"fastops\.batch_norm: expected weight of shape \[3\]"):
        torch.compile(fastops.batch_norm, fullgraph=True)(x, c3, c3.clone(), torch.ones(4))
    with FakeTensorMode() as mode, pytest.raises(ValueError, match=r"expected x to have at least 2 dims"):
        torch.ops.fastops.batch_norm(mode.from_tensor(torch.ones(5)), None, None, None, None, True, 1e-5)


def test_kernels_check_what_the_python_face_checks() -> None:
    """A direct torch.ops call reaches the C++ checks, which name the op and the argument."""
    x = torch.randn(4, 3, 5, 5)
    ops = torch.ops.fastops
    with pytest.raises(RuntimeError, match=r"fastops\.batch_norm: expected weight of shape \[3\]"):
        ops.batch_norm(x, torch.ones(4), None, None, None, True, 1e-5)
    with pytest.raises(RuntimeError, match=r"fastops\.batch_norm: expected running_mean and running_var"):
        ops.batch_norm(x, None, None, None, None, False, 1e-5)
    with pytest.raises(RuntimeError, match=r"fastops\.batch_norm: expected more than 1 value per channel"):
        ops.batch_norm(torch.ones(1, 3), None, None, None, None, True, 1e-5)
    with pytest.raises(RuntimeError, match=r"fastops\.batch_norm: eps=.* does not fit torch\.float32"):
        ops.batch_norm(x, None, None, None, None, True, 1e39)
    stat = torch.ones(3)
    with pytest.raises(RuntimeError, match=r"batch_norm_backward: expected grad_out to have the shape of x"):
        ops.batch_norm_backward(torch.ones(4, 3, 5, 4), x, None, stat, stat, True, True)
    with pytest.raises(
        RuntimeError, match=r"batch_norm_backward: expected mean to be a torch\.float32 tensor of shape \[3\]"
    ):
        ops.batch_norm_backward(x, x, None, torch.ones(3, dtype=torch.float64), stat, True, True)


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
def test_cuda_rejects_device_mismatch() -> None:
    x = torch.randn(4, 3, 5, 5, device="cuda")
    with pytest.raises(RuntimeError, match=r"fastops\.batch_norm: expected weight on the same device"):
        fastops.batch_norm(x, None, None, torch.ones(3), training=True)
