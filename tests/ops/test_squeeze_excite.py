"""fastops.squeeze_excite: its contract spec, and the edge cases of its own (NaN/inf, determinism across
thread counts, what is saved for backward, errors)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import fastops
from fastops import reference
from fastops.ops.squeeze_excite import ACTIVATIONS, GATES
from fastops.reference.squeeze_excite import ACTIVATIONS as ACTIVATION_FNS
from tests.helpers import assert_close_to_reference, assert_same_nonfinite, devices
from tests.ops.contract import ContractTests, OpSpec, Sample

COMBOS = list(itertools.product(ACTIVATIONS, GATES))
# (N, C, H, W): odd sizes, HW = 1, C past one and across the NHWC kernel's 4-vector channel chunk
# (64 floats on AVX-512) with a tail, C of one and two whole vectors (16, 32), long rows, an empty batch.
# HW of 35 and 81 with N * C rows past a multiple of the vector width: the NCHW short-row group walks
# (AVX2: 35; AVX-512: both) and the rows after the last whole group.
SHAPES = [
    (2, 8, 5, 7),
    (3, 37, 5, 7),
    (1, 1, 1, 1),
    (2, 64, 1, 1),
    (2, 70, 9, 9),
    (2, 16, 33, 31),
    (2, 32, 7, 5),
    (0, 8, 4, 4),
]


def _layouts(x: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """x's values in views of the same shape: contiguous, channels_last, a strided slice, H and W
    transposed (dense, neither layout), storage offset 1, and stride 0 over the batch."""
    n, c, h, w = x.shape
    yield "contiguous", x
    yield "channels_last", x.contiguous(memory_format=torch.channels_last)
    wide = torch.zeros(n, c, h, 2 * w, dtype=x.dtype, device=x.device)
    wide[..., ::2] = x
    yield "sliced", wide[..., ::2]
    yield "hw-transposed", x.transpose(2, 3).contiguous().transpose(2, 3)
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    flat[1:] = x.reshape(-1)
    yield "offset1", flat[1:].view(x.shape)
    if n >= 1:
        yield "expanded", x[:1].expand(3, c, h, w)


def _weights(
    channels: int, dtype: torch.dtype, device: str, requires_grad: bool, bias: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    reduced = max(1, channels // 4)

    def make(*shape: int, fan_in: int) -> torch.Tensor:
        t = torch.randn(shape, dtype=torch.float64) * 2 / fan_in**0.5
        return t.to(dtype=dtype, device=device).requires_grad_(requires_grad)

    w1, w2 = make(reduced, channels, fan_in=channels), make(channels, reduced, fan_in=reduced)
    b1 = make(reduced, fan_in=channels) if bias else None
    b2 = make(channels, fan_in=reduced) if bias else None
    return w1, b1, w2, b2


def se_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    """Every shape in every layout, the act/gate combination cycling; every combination on one shape
    in both layouts; and FCs without biases."""
    torch.manual_seed(0)
    combos = itertools.cycle(COMBOS)
    for shape in SHAPES:
        base = torch.randn(shape, dtype=torch.float64).to(dtype=dtype, device=device)
        for layout, x in _layouts(base):
            act, gate = next(combos)
            weights = _weights(x.shape[1], dtype, device, requires_grad)
            x = x.detach().requires_grad_(requires_grad)
            yield Sample((x, *weights, act, gate), id=f"{tuple(x.shape)}-{layout}-{act}-{gate}")
    base = torch.randn(4, 24, 6, 6, dtype=torch.float64).to(dtype=dtype, device=device)
    for (act, gate), (layout, x) in itertools.product(COMBOS, list(_layouts(base))[:2]):
        weights = _weights(24, dtype, device, requires_grad)
        yield Sample(
            (x.detach().requires_grad_(requires_grad), *weights, act, gate), id=f"{layout}-{act}-{gate}"
        )
    x = base.detach().requires_grad_(requires_grad)
    yield Sample(
        (x, *_weights(24, dtype, device, requires_grad, bias=False), "silu", "sigmoid"), id="no-bias"
    )


def se_small(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    torch.manual_seed(1)
    for i, (act, gate) in enumerate(COMBOS):
        x = torch.randn(2, 6, 3, 4, dtype=torch.float64).to(dtype=dtype, device=device)
        if i % 2:
            x = x.contiguous(memory_format=torch.channels_last)
        weights = _weights(6, dtype, device, requires_grad)
        yield Sample((x.requires_grad_(requires_grad), *weights, act, gate), id=f"{act}-{gate}-{i % 2}")


def se_compile(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    samples = list(se_small(device, dtype, requires_grad))
    return iter([samples[0], samples[3]])  # relu/sigmoid NCHW, silu/hardsigmoid channels_last


def se_opcheck(device: str, dtype: torch.dtype) -> Iterator[tuple]:
    ops = torch.ops.fastops
    compute = torch.float32
    for layout, x in _layouts(torch.randn(2, 19, 3, 5, dtype=dtype, device=device)):
        if layout == "expanded":
            continue
        x = x.detach().requires_grad_(True)
        g = torch.randn(x.shape, dtype=dtype, device=device).contiguous(
            memory_format=torch.channels_last if layout == "channels_last" else torch.contiguous_format
        )
        s = torch.rand(2, 19, dtype=compute, device=device, requires_grad=True)
        dp = torch.randn(2, 19, dtype=compute, device=device, requires_grad=True)
        yield ops.squeeze_excite_pool.default, (x,)
        yield ops.squeeze_excite_scale.default, (x, s)
        yield ops.squeeze_excite_backward_reduce.default, (g.requires_grad_(True), x)
        yield ops.squeeze_excite_backward_input.default, (g.detach().requires_grad_(True), s, dp)
        # The block (its autograd in C++), and its forward and backward ops, which have no autograd
        # of their own.
        plain, grad = x.detach(), g.detach()
        for act, gate in (("relu", "hardsigmoid"), ("silu", "sigmoid"), ("gelu", "hardsigmoid")):
            trained = _weights(19, dtype, device, requires_grad=True, bias=act != "silu")
            yield ops.squeeze_excite.default, (x, *trained, act, gate)
            weights = _weights(19, dtype, device, requires_grad=False, bias=act != "silu")
            yield ops.squeeze_excite_forward.default, (plain, *weights, act, gate)
            _, *intermediates = ops.squeeze_excite_forward.default(plain, *weights, act, gate)
            for input_grad in (True, False):
                args = (grad, plain, weights[0], weights[2], *intermediates, act, gate, input_grad)
                yield ops.squeeze_excite_backward.default, args


def _eager(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: torch.Tensor | None,
    w2: torch.Tensor,
    b2: torch.Tensor | None,
    act: str = "relu",
    gate: str = "sigmoid",
) -> torch.Tensor:
    """The SE block as a user writes it (aten's hardsigmoid), run in fp16/bf16 for the 2x rule."""
    hidden = ACTIVATION_FNS[act](F.linear(x.mean((2, 3)), w1, b1))
    z = F.linear(hidden, w2, b2)
    s = torch.sigmoid(z) if gate == "sigmoid" else F.hardsigmoid(z)
    return x * s[:, :, None, None]


SQUEEZE_EXCITE = OpSpec(
    name="squeeze_excite",
    op=fastops.squeeze_excite,
    reference=reference.squeeze_excite,
    eager=_eager,
    sample_inputs=se_samples,
    small_inputs=se_small,
    compile_inputs=se_compile,
    opcheck_inputs=se_opcheck,
    autocast="input",
    output_format="memory_format_of_input",
    # Gradients of the FC weights sum over the batch and the (N, C) chain; dx sums dp / HW and g * s.
    fp32_tolerances={"grad": (1e-5, 1e-5)},
)


class TestSqueezeExciteContract(ContractTests):
    spec = SQUEEZE_EXCITE


# ---- edge cases ---------------------------------------------------------------------------------


def _sample(dtype: torch.dtype = torch.float32, shape: tuple[int, ...] = (3, 16, 6, 5)) -> list:
    torch.manual_seed(2)
    x = torch.randn(shape, dtype=dtype)
    return [x, *_weights(shape[1], dtype, "cpu", False)]


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_propagates_like_eager(layout: str, value: float) -> None:
    x, *weights = _sample()
    x[1, 3, 2, 2] = value
    x[2, 0, 0, 0] = value
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    for act, gate in COMBOS:
        x_req = x.clone().requires_grad_(True)
        y = fastops.squeeze_excite(x_req, *weights, act, gate)
        x_ref = x.clone().requires_grad_(True)
        want = _eager(x_ref, *weights, act, gate)
        assert_same_nonfinite(y, want)
        g = torch.ones_like(y)
        (dx,) = torch.autograd.grad(y, x_req, g)
        (dx_ref,) = torch.autograd.grad(want, x_ref, g)
        assert_same_nonfinite(dx, dx_ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_bitwise_repeatable_across_thread_counts(dtype: torch.dtype, layout: str) -> None:
    x, w1, b1, w2, b2 = _sample(dtype, (4, 200, 17, 19))
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    params = [w1, b1, w2, b2]
    for p in params:
        p.requires_grad_(True)
    g = torch.randn(x.shape, dtype=dtype)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            y = fastops.squeeze_excite(x, w1, b1, w2, b2, "silu", "sigmoid")
            results.append([y, *torch.autograd.grad(y, [x, *params], g)])
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("batch", [1, 3, 4, 5, 8, 9, 16, 17])
@pytest.mark.parametrize("channels,reduced", [(16, 4), (37, 9), (96, 24), (576, 144)])
def test_fcs_match_float64_at_every_batch(batch: int, channels: int, reduced: int) -> None:
    """The FCs of a float32 block on the CPU run our small-batch kernels up to 16 rows (blocks of 4
    and 8 rows, W rows past a whole register block, K past a whole vector) and ATen's GEMM above:
    every output and gradient matches the float64 block, with and without x's gradient."""
    torch.manual_seed(batch * 1000 + channels)
    x = torch.randn(batch, channels, 3, 5)
    params = [p for p in _weights(channels, torch.float32, "cpu", True) if p is not None]
    g = torch.randn_like(x)
    x64 = x.double().requires_grad_(True)
    params64 = [p.detach().double().requires_grad_(True) for p in params]
    y64 = reference.squeeze_excite(x64, *params64, "gelu", "sigmoid")
    want = [y64, *torch.autograd.grad(y64, [x64, *params64], g.double())]
    for x_grad in (True, False):
        xi = x.clone().requires_grad_(x_grad)
        y = fastops.squeeze_excite(xi, *params, "gelu", "sigmoid")
        got = [y, *torch.autograd.grad(y, [xi, *params] if x_grad else params, g)]
        expected = want if x_grad else [want[0], *want[2:]]
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_raw_ops_reject_fc_operands_that_do_not_fit() -> None:
    """squeeze_excite_forward/_backward take the FC weights and the saved intermediates from any
    caller; one that does not fit raises an error naming the op and the argument (on every build,
    before our FC kernels or ATen's GEMM would read it)."""
    ops = torch.ops.fastops
    x, w1, b1, w2, b2 = _sample()
    fwd = "fastops.squeeze_excite_forward: expected"
    with pytest.raises(RuntimeError, match=f"{fwd} fc1_weight of shape"):
        ops.squeeze_excite_forward(x, w1[:, :-1].contiguous(), b1, w2, b2, "relu", "sigmoid")
    with pytest.raises(RuntimeError, match=f"{fwd} fc2_weight of shape"):
        ops.squeeze_excite_forward(x, w1, b1, w2[:-1].contiguous(), b2, "relu", "sigmoid")
    with pytest.raises(RuntimeError, match=f"{fwd} fc2_bias of shape"):
        ops.squeeze_excite_forward(x, w1, b1, w2, b2[:-1], "relu", "sigmoid")
    _, *saved = ops.squeeze_excite_forward(x, w1, b1, w2, b2, "relu", "sigmoid")
    g = torch.ones_like(x)
    bwd = "fastops.squeeze_excite_backward: expected"
    with pytest.raises(RuntimeError, match=f"{bwd} fc2_weight of shape"):
        ops.squeeze_excite_backward(g, x, w1, w2[:, :-1].contiguous(), *saved, "relu", "sigmoid", True)
    pooled, hidden, activated, pre_gate, scale = saved
    with pytest.raises(RuntimeError, match=f"{bwd} activated of shape"):
        ops.squeeze_excite_backward(
            g, x, w1, w2, pooled, hidden, activated[:, :-1], pre_gate, scale, "relu", "sigmoid", True
        )
    with pytest.raises(RuntimeError, match=f"{bwd} hidden to be torch.float32"):
        ops.squeeze_excite_backward(
            g, x, w1, w2, pooled, hidden.double(), activated, pre_gate, scale, "relu", "sigmoid", True
        )


def _saved_bytes(fn, *args) -> tuple[int, int]:  # noqa: ANN001
    """(bytes saved for backward in tensors of x's size or larger, count of such tensors)."""
    big = args[0].numel()
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.numel() >= big:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(seen.values()), len(seen)


@devices
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("shape", [(3, 24, 9, 11), (1, 16, 64, 65)], ids=["short_rows", "long_rows"])
def test_memory_passes_alone(device: str, dtype: torch.dtype, layout: str, shape: tuple) -> None:
    """The block's four memory passes on their own, without the FCs' GEMMs, against float64: the half
    precision kernels in isolation (on the H200, racecheck aborted inside the whole block's fp16/bf16
    test, where cuBLAS's kernels run too). Rows of 64 x 65 = 4160 elements take the NCHW
    block-per-row reduction, 9 x 11 the warp-per-row one."""
    gen = torch.Generator().manual_seed(7)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    n, c, h, w = shape
    x = torch.randn(shape, generator=gen).to(device=device, dtype=dtype).contiguous(memory_format=fmt)
    g = torch.randn(shape, generator=gen).to(device=device, dtype=dtype).contiguous(memory_format=fmt)
    scale = torch.rand(n, c, generator=gen).to(device)
    grad_pool = torch.randn(n, c, generator=gen).to(device)
    x64, g64, s64, p64 = x.double(), g.double(), scale.double()[:, :, None, None], grad_pool.double()
    ops = torch.ops.fastops
    torch.testing.assert_close(ops.squeeze_excite_pool(x).double(), x64.mean((2, 3)), rtol=1e-5, atol=1e-6)
    assert_close_to_reference(ops.squeeze_excite_scale(x, scale), x64 * s64)
    reduced = ops.squeeze_excite_backward_reduce(g, x).double()
    torch.testing.assert_close(reduced, (g64 * x64).sum((2, 3)), rtol=1e-5, atol=1e-4)
    dx = ops.squeeze_excite_backward_input(g, scale, grad_pool)
    assert_close_to_reference(dx, g64 * s64 + (p64 / (h * w))[:, :, None, None])


@pytest.mark.parametrize("act,gate", COMBOS)
def test_saves_no_more_than_eager(act: str, gate: str) -> None:
    x, *weights = _sample()
    x.requires_grad_(True)
    for w in weights:
        w.requires_grad_(True)
    ours, ours_count = _saved_bytes(lambda *a: fastops.squeeze_excite(*a, act, gate), x, *weights)
    eager, _ = _saved_bytes(lambda *a: _eager(*a, act, gate), x, *weights)
    assert ours_count == 1 and ours == x.untyped_storage().nbytes(), "only x is saved at full size"
    assert ours <= eager


def test_double_backward_raises() -> None:
    x, *weights = _sample()
    x.requires_grad_(True)
    y = fastops.squeeze_excite(x, *weights)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y), create_graph=True)
    with pytest.raises(RuntimeError):
        dx.sum().backward()


def test_double_backward_through_a_differentiable_grad_out_raises() -> None:
    """A graph built through the backward (create_graph with a grad_out that needs a gradient)
    raises when differentiated, as @once_differentiable does, instead of treating dx as constant."""
    x, *weights = _sample()
    x.requires_grad_(True)
    y = fastops.squeeze_excite(x, *weights)
    grad_out = torch.ones_like(y, requires_grad=True)
    (dx,) = torch.autograd.grad(y, x, grad_out, create_graph=True)
    assert dx.requires_grad
    with pytest.raises(RuntimeError, match="squeeze_excite: differentiable once"):
        dx.sum().backward()


def test_gradients_of_some_inputs_only() -> None:
    """Each gradient lands on its own argument whichever of x, the weights and the biases need one
    and whether the biases are given (the C++ node indexes only the tensors passed)."""
    torch.manual_seed(3)
    for bias in (True, False):
        x = torch.randn(2, 12, 5, 4, dtype=torch.float64)
        weights = _weights(12, torch.float64, "cpu", False, bias=bias)
        for mask in itertools.product((False, True), repeat=5):
            args = [
                t if t is None else t.detach().requires_grad_(m)
                for t, m in zip((x, *weights), mask, strict=True)
            ]
            wanted = [t for t in args if t is not None and t.requires_grad]
            if not wanted:
                continue
            g = torch.randn_like(x)
            ours = torch.autograd.grad(fastops.squeeze_excite(*args, "silu", "hardsigmoid"), wanted, g)
            eager = torch.autograd.grad(_eager(*args, "silu", "hardsigmoid"), wanted, g)
            for a, b in zip(ours, eager, strict=True):
                torch.testing.assert_close(a, b)


def test_module_free_use_under_no_grad() -> None:
    x, *weights = _sample()
    with torch.no_grad():
        y = fastops.squeeze_excite(x, *weights, "gelu", "hardsigmoid")
    torch.testing.assert_close(y, _eager(x, *weights, "gelu", "hardsigmoid"))


@pytest.mark.parametrize(
    "change,error,words",
    [
        (lambda a: a.__setitem__(0, a[0][0]), ValueError, "expected x to be 4-D"),
        (lambda a: a.__setitem__(0, a[0].int()), TypeError, "expected x to be a float32"),
        (lambda a: a.__setitem__(0, "x"), TypeError, "expected x to be a torch.Tensor"),
        (lambda a: a.__setitem__(1, a[1][:, :-1]), ValueError, "expected fc1_weight of shape"),
        (lambda a: a.__setitem__(1, a[1][0]), ValueError, "expected fc1_weight to be 2-D"),
        (lambda a: a.__setitem__(2, a[2][:-1]), ValueError, "expected fc1_bias of shape"),
        (lambda a: a.__setitem__(3, a[3].t()), ValueError, "expected fc2_weight of shape"),
        (lambda a: a.__setitem__(4, a[4][:-1]), ValueError, "expected fc2_bias of shape"),
        (lambda a: a.__setitem__(3, a[3].int()), TypeError, "expected fc2_weight to be a floating tensor"),
        (lambda a: a.__setitem__(3, None), TypeError, "expected fc2_weight to be a torch.Tensor"),
        (lambda a: a.append("tanh"), ValueError, "expected act to be one of"),
        (lambda a: a.extend(["relu", "softmax"]), ValueError, "expected gate to be one of"),
    ],
)
def test_bad_input_errors_name_the_op_and_argument(change, error, words) -> None:  # noqa: ANN001
    args = _sample()
    change(args)
    with pytest.raises(error, match=f"fastops.squeeze_excite: {words}"):
        fastops.squeeze_excite(*args)


def test_kernel_errors_name_the_op_and_argument() -> None:
    ops = torch.ops.fastops
    x = torch.randn(2, 3, 4, 5)
    with pytest.raises(RuntimeError, match=r"squeeze_excite_scale: expected scale to be torch\.float32"):
        ops.squeeze_excite_scale(x, torch.rand(2, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"squeeze_excite_scale: expected scale of shape \[2, 3\]"):
        ops.squeeze_excite_scale(x, torch.rand(2, 4))
    with pytest.raises(RuntimeError, match="squeeze_excite_pool: expected x to be 4-D"):
        ops.squeeze_excite_pool(x[0])
    with pytest.raises(
        RuntimeError, match="squeeze_excite_backward_reduce: expected grad_out to have the shape"
    ):
        ops.squeeze_excite_backward_reduce(x[:1], x)
    with pytest.raises(RuntimeError, match="squeeze_excite_backward_input: expected grad_pool of shape"):
        ops.squeeze_excite_backward_input(x, torch.rand(2, 3), torch.rand(3, 3))
    w1, b1, w2, b2 = _weights(3, torch.float32, "cpu", False)
    with pytest.raises(RuntimeError, match=r"squeeze_excite_forward: expected act to be one of \['relu'"):
        ops.squeeze_excite_forward(x, w1, b1, w2, b2, "tanh", "sigmoid")
    with pytest.raises(RuntimeError, match="squeeze_excite_forward: expected gate to be one of"):
        ops.squeeze_excite_forward(x, w1, b1, w2, b2, "relu", "softmax")
    with pytest.raises(RuntimeError, match="squeeze_excite_forward: expected x to be 4-D"):
        ops.squeeze_excite_forward(x[0], w1, b1, w2, b2, "relu", "sigmoid")
