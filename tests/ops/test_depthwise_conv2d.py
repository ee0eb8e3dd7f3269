"""fastops.depthwise_conv2d: its contract spec (against F.conv2d(groups=C) in float64, both layouts),
and the edge cases of its own (bitwise-repeatable weight gradients, errors, >2^31 elements)."""

from __future__ import annotations

import hashlib
import random
import zlib
from collections.abc import Iterator

import pytest
import torch

import fastops
from fastops import reference
from tests.helpers import DEVICES, assert_close_to_reference, cuda_only, spot_slices
from tests.ops.contract import ContractTests, OpSpec, Sample

# ---- sample inputs -----------------------------------------------------------------------------------


def _case_grid() -> list[tuple]:
    """(N, C, H, W, k, stride, dilation, padding): every k, stride, dilation and padding kind at least
    once with each other axis, sampled (not the full cross product) to keep the suite fast."""
    rng = random.Random(5)
    cases = []
    for k in (1, 3, 5, 7, 9):
        for stride in (1, 2):
            for dilation in (1, 2):
                for padding in (0, "same", "valid", "half"):
                    if padding == "same" and stride != 1:
                        continue
                    pad = (k // 2) * dilation if padding == "half" else padding
                    span = dilation * (k - 1) + 1
                    n = rng.choice((1, 2))
                    c = rng.choice((1, 3, 5, 13, 17))
                    low = span if pad in (0, "valid") else 1
                    h = rng.randint(low, low + 9)
                    w = rng.randint(low, low + 9)
                    cases.append((n, c, h, w, k, stride, dilation, pad))
    return cases


# Batch 1, empty batch, H or W smaller than k, rectangular kernels, C not a multiple of 8,
# asymmetric padding: each is a separate path on some device, so every dtype runs all of them.
EDGE_CASES = [
    (0, 4, 9, 9, 3, 1, 1, 1),  # empty batch
    (1, 9, 2, 11, 5, 1, 1, 2),  # H smaller than k
    (2, 6, 8, 3, 7, 2, 1, 3),  # W smaller than k, stride 2
    (1, 33, 15, 14, (3, 5), (2, 1), (1, 2), (1, 3)),  # rectangular everything
    (2, 40, 16, 16, 3, 2, 1, 1),  # C a multiple of 8 with a vector tail (40 = 2*16 + 8)
    (1, 70, 7, 7, 3, 1, 1, 1),  # the NHWC 4-vector channel block plus a tail
    (1, 3, 12, 12, 4, 1, 1, "same"),  # even kernel: asymmetric "same" padding
    (2, 5, 9, 11, (2, 4), 1, (2, 1), "same"),  # rectangular even kernel, asymmetric on both axes
    (1, 2, 10, 10, 3, 3, 3, 4),  # padding larger than the kernel's half span
    (2, 7, 9, 10, 3, 2, 1, (0, 1, 1, 2)),  # four ints (top, bottom, left, right): TF "same", stride 2
    (1, 5, 8, 7, (3, 5), 1, (2, 1), (2, 0, 3, 1)),  # four ints, rectangular, one side unpadded
]

# C a multiple of 8: the channels_last 16-byte vector kernels on CUDA, each compile-time body
# (3x3, 5x5, 7x7, generic) with stride 1 and 2, dilation and asymmetric padding.
VECTOR_CASES = [
    (2, 16, 11, 13, 3, 1, 1, 1),
    (1, 24, 9, 10, 5, 1, 2, 4),
    (2, 32, 14, 14, 7, 1, 1, 3),
    (1, 16, 13, 12, 7, 2, 1, 3),
    (1, 8, 9, 9, (3, 5), (1, 2), 1, (1, 2)),
    (1, 8, 12, 12, 4, 1, 1, "same"),
]

# Bigger planes and channel counts than the grid: the register-blocked interiors (3/5/7 taps, stride 1
# and 2, dilation 2), the strided dgrad phase blocks and the wgrad workspace; fp32 and bf16.
MOBILENET_CASES = [
    (2, 40, 20, 21, 7, 1, 1, 3),
    (1, 24, 21, 19, 5, 2, 1, 2),
    (1, 20, 18, 18, 3, 1, 2, 2),
    (1, 17, 23, 23, 3, 3, 1, 1),
    (2, 20, 11, 14, 3, (2, 1), 1, 1),  # row stride 2, column stride 1: whole-row blocks, rows skipped
    (1, 9, 6, 28, 7, (3, 1), 1, (3, 2)),  # the same with asymmetric padding, blocks of 7
]
# Still bigger ones, fp32 only.
MOBILENET_FP32_CASES = [
    (2, 32, 28, 28, 3, 1, 1, 1),
    (2, 96, 29, 29, 3, 2, 1, 1),
    (1, 144, 14, 14, 5, 1, 1, 2),
    (3, 24, 7, 7, 7, 1, 1, 3),
]
# Weight gradients over many positions (N*OH*OW well above the CUDA kernel's 4096 a partition:
# several partitions and their combine; the 7x7 case also runs two tap groups) and over none (an
# empty batch: the zero-position path), on every device and layout.
WGRAD_CASES = [(4, 16, 64, 64, 3, 1, 1, 1), (3, 8, 48, 48, 7, 1, 1, 3), (0, 8, 9, 9, 3, 1, 1, 1)]

# The fp32 NCHW channel-blocked path (small maps: 16/8 channels transposed into a padded tile): C
# below, at and past the vector width (tails of 1-15 lanes), odd and rectangular maps, stride 2 (the
# input gradient over a spread-out grad_output), dilation, asymmetric padding, padding past the
# kernel's span (the input gradient's plane path), output widths of every register block size,
# outputs over 1 MiB; fp32, contiguous and sliced.
NCHW_BLOCKED_CASES = [
    (2, 17, 7, 7, 3, 1, 1, 1),
    (1, 33, 13, 11, 3, 2, 1, 1),
    (3, 24, 14, 14, 7, 1, 1, 3),
    (1, 40, 9, 15, 5, 1, 2, 4),
    (2, 16, 10, 9, (3, 5), (2, 1), (1, 2), (0, 2, 1, 3)),
    (1, 9, 6, 23, 3, 1, 1, (3, 0, 2, 4)),
    (1, 48, 28, 28, 3, 2, 1, 1),
    (2, 8, 5, 4, 7, 1, 1, 3),
    (2, 20, 11, 13, 3, (2, 1), 1, 1),  # input gradient: grad_output spread by (2, 1)
    (2, 24, 15, 15, 5, 2, 1, 2),
    (1, 16, 14, 13, 7, 2, 1, 3),
    (32, 40, 15, 15, 5, 1, 1, 2),  # over 1 MiB of output: streaming stores, some blocks unaligned
    (32, 40, 16, 16, 5, 1, 1, 2),  # the same with whole cache lines per 8-channel block (AVX2)
]

# The fp32 NCHW register path (AVX-512, rows to 16 wide; at stride 1 as wide as the output's: R = 16 // W
# rows per vector): one-vector planes in groups of 4 with a remainder, planes of 2-3 vectors grouped,
# 4+ vectors per plane, planes held in registers (1, 2 or 4 vectors), one row per vector (taps
# without a permute), 14 of 16 lanes, asymmetric row padding, dilation, rows cut off at the top.
NCHW_REGISTER_CASES = [
    (9, 5, 4, 4, 3, 1, 1, 1),
    (2, 7, 8, 8, 3, 1, 1, 1),
    (2, 5, 16, 16, 3, 1, 1, 1),
    (2, 3, 14, 14, 5, 1, 1, 2),
    (3, 3, 7, 7, 3, 1, 1, 1),
    (2, 3, 6, 5, 3, 1, 1, (2, 0, 1, 1)),
    (2, 3, 7, 7, 3, 1, 1, (2, 1, 1, 1)),  # a tap reading the vector above in place (no permute)
    (2, 3, 11, 12, 3, 1, 2, (1, 3, 2, 2)),
    (1, 4, 9, 3, 3, 1, 1, 1),
    (2, 4, 5, 9, 3, 1, 1, (0, 0, 1, 1)),
    # Strided (forward and weight gradient): one input row a vector, two output rows.
    (2, 5, 16, 16, 3, 2, 1, 1),
    (2, 3, 14, 13, 3, (2, 1), 1, 1),
    (2, 3, 11, 12, 3, (1, 2), 2, (1, 0, 2, 1)),
    (3, 4, 9, 10, (1, 3), 2, 1, 0),
    # Rows over 16 wide (3x3): several vectors a row, masked at both ends, kernel rows outside the
    # plane skipped; dilation, asymmetric row padding, strides.
    (2, 3, 20, 33, 3, 1, 1, 1),
    (1, 2, 17, 17, 3, 1, 2, 2),
    (2, 3, 9, 47, 3, 1, 1, (2, 1, 1, 1)),
    (1, 3, 5, 64, 3, 1, 1, (0, 0, 1, 1)),
    (2, 3, 19, 40, 3, 2, 1, 1),  # strided (forward and weight gradient): two loads and a permute
    (1, 2, 17, 33, 3, (2, 1), 1, (1, 0, 0, 1)),
    (1, 2, 9, 35, 3, (1, 2), 2, 2),
    # Runs of whole vectors (four at a time, plain loads) and what is left of them, on both ISAs;
    # rows that reach one kernel row only (dilated, single-row planes).
    (1, 2, 6, 100, 3, 1, 1, 1),
    (1, 2, 5, 197, 3, 2, 1, 1),
    (2, 2, 2, 90, 3, 1, 2, 2),
    (1, 1, 1, 83, 3, 1, 1, 1),
    # The stride-2 input gradient (a window of grad_output spread to the dx lanes of each parity),
    # every padding it takes; a 1x9 kernel (nine taps, not 3x3) stays off the wide path.
    (1, 2, 8, 35, 3, 2, 1, (0, 1, 0, 1)),
    (2, 2, 9, 50, 3, 2, 1, 2),
    (1, 2, 6, 33, 3, 2, 1, 0),
    (1, 2, 4, 40, (1, 9), 1, 1, (0, 0, 4, 4)),
]

GRID_CASES = _case_grid()
CASES = GRID_CASES + EDGE_CASES + VECTOR_CASES
LAYOUTS = ("contiguous", "channels_last", "sliced")
TWO_LAYOUTS = ("contiguous", "channels_last")


def _ids(case: tuple) -> str:
    n, c, h, w, k, s, d, p = case
    return f"n{n}c{c}h{h}w{w}-k{k}-s{s}-d{d}-p{p}".replace(" ", "")


def _layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "sliced":  # a non-contiguous view: every other column of a wider tensor
        wide = torch.empty(*x.shape[:3], 2 * x.shape[3], dtype=x.dtype, device=x.device)
        wide[..., ::2] = x
        return wide[..., ::2]
    return x


def _inputs(
    case: tuple, dtype: torch.dtype, device: str, layout: str, bias: bool = True, requires_grad: bool = False
) -> list[torch.Tensor | None]:
    n, c, h, w, k, _, _, _ = case
    kh, kw = (k, k) if isinstance(k, int) else k
    gen = torch.Generator().manual_seed(
        zlib.crc32(repr(case).encode())
    )  # not hash(): str hashes vary by process
    x = torch.randn(n, c, h, w, generator=gen, dtype=torch.float64)
    wt = torch.randn(c, 1, kh, kw, generator=gen, dtype=torch.float64)
    b = torch.randn(c, generator=gen, dtype=torch.float64) if bias else None
    x = _layout(x.to(dtype=dtype, device=device), layout)
    wt = wt.to(dtype=dtype, device=device)
    b = b.to(dtype=dtype, device=device) if b is not None else None
    return [t.requires_grad_(requires_grad) if t is not None else None for t in (x, wt, b)]


def _samples(
    cases: list[tuple[tuple, str]], device: str, dtype: torch.dtype, requires_grad: bool, bias: bool = True
) -> Iterator[Sample]:
    for case, layout in cases:
        _, _, _, _, _, stride, dilation, padding = case
        x, w, b = _inputs(case, dtype, device, layout, bias, requires_grad)
        yield Sample(
            (x, w, b, stride, padding, dilation), id=f"{_ids(case)}-{layout}" + ("" if bias else "-nobias")
        )


def depthwise_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    """float64 (CPU): every case in every layout. Lower precisions: every 3rd grid case (rotating the
    layout), every edge case in each layout, every vector-kernel case in channels_last; fp32 and bf16
    also the MobileNet-like and weight-gradient cases in both dense layouts (fp32 the bigger ones, and
    the NCHW blocked and register paths' cases, too; bf16 those in NCHW).
    A few edge cases without bias."""
    if dtype == torch.float64:
        cases = [(c, layout) for c in CASES for layout in LAYOUTS]
    else:
        cases = (
            [(c, LAYOUTS[i % 3]) for i, c in enumerate(GRID_CASES[::3])]
            + [(c, layout) for c in EDGE_CASES for layout in LAYOUTS]
            + [(c, "channels_last") for c in VECTOR_CASES]
        )
    if dtype in (torch.float32, torch.bfloat16):
        cases += [(c, layout) for c in MOBILENET_CASES + WGRAD_CASES for layout in TWO_LAYOUTS]
    if dtype == torch.float32:
        cases += [(c, layout) for c in MOBILENET_FP32_CASES for layout in TWO_LAYOUTS]
        cases += [(c, layout) for c in NCHW_BLOCKED_CASES for layout in ("contiguous", "sliced")]
        cases += [(c, layout) for c in NCHW_REGISTER_CASES for layout in ("contiguous", "sliced")]
    if dtype == torch.bfloat16:  # (fp16/bf16 run the same fp32 paths through widened chunks)
        cases += [(c, "contiguous") for c in NCHW_BLOCKED_CASES + NCHW_REGISTER_CASES]
    yield from _samples(cases, device, dtype, requires_grad)
    yield from _samples(
        [(c, "channels_last") for c in EDGE_CASES[:4]], device, dtype, requires_grad, bias=False
    )


def depthwise_small(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    """Both dense layouts of (2, 3, 6, 7) with a square, a strided dilated, a rectangular and an even
    ("same": asymmetric) kernel."""
    configs = [(3, 1, 1, "same"), (3, 2, 2, 1), ((2, 3), (1, 2), 1, (1, 0)), (4, 1, 1, "same")]
    cases = [((2, 3, 6, 7, k, s, d, p), layout) for layout in TWO_LAYOUTS for k, s, d, p in configs]
    yield from _samples(cases, device, dtype, requires_grad)


def depthwise_compile(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    yield from _samples(
        [((2, 6, 11, 10, 3, 2, 1, "valid"), layout) for layout in TWO_LAYOUTS], device, dtype, requires_grad
    )


def depthwise_opcheck(device: str, dtype: torch.dtype) -> Iterator[tuple]:
    args = ([2, 1], [1, 1, 0, 2], [1, 2])
    for layout in TWO_LAYOUTS:
        x = _layout(torch.randn(2, 5, 9, 8, device=device, dtype=dtype), layout).requires_grad_(True)
        w = torch.randn(5, 1, 3, 3, device=device, dtype=dtype, requires_grad=True)
        b = torch.randn(5, device=device, dtype=dtype, requires_grad=True)
        yield torch.ops.fastops.depthwise_conv2d.default, (x, w, b, *args)
        yield torch.ops.fastops.depthwise_conv2d.default, (x, w, None, *args)
        g = torch.randn_like(torch.ops.fastops.depthwise_conv2d(x, w, b, *args))
        yield (
            torch.ops.fastops.depthwise_conv2d_backward_input.default,
            (g, w.detach(), list(x.shape), *args, layout == "channels_last"),
        )
        yield torch.ops.fastops.depthwise_conv2d_backward_weight.default, (g, x.detach(), [3, 3], *args)


DEPTHWISE_CONV2D = OpSpec(
    name="depthwise_conv2d",
    op=fastops.depthwise_conv2d,
    reference=reference.depthwise_conv2d,
    sample_inputs=depthwise_samples,
    small_inputs=depthwise_small,
    compile_inputs=depthwise_compile,
    opcheck_inputs=depthwise_opcheck,
    autocast="autocast",
    output_format="memory_format_of_input",
    # fp32: the reductions sum up to a few hundred products; allow for their rounding.
    fp32_tolerances={"output": (1e-5, 1e-4), "grad": (1e-5, 1e-4)},
)


class TestDepthwiseConv2dContract(ContractTests):
    spec = DEPTHWISE_CONV2D


# ---- determinism -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ("contiguous", "channels_last"))
def test_weight_gradient_is_bitwise_repeatable(layout: str) -> None:
    """Same partition, same order, whatever the thread count: identical bits run after run."""
    x = _layout(torch.randn(4, 24, 33, 31), layout)
    g = _layout(torch.randn(4, 24, 33, 31), layout)
    args = ([3, 3], [1, 1], [1, 1, 1, 1], [1, 1])
    first = torch.ops.fastops.depthwise_conv2d_backward_weight(g, x, *args)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, threads):
            torch.set_num_threads(n)
            for _ in range(2):
                again = torch.ops.fastops.depthwise_conv2d_backward_weight(g, x, *args)
                assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    finally:
        torch.set_num_threads(threads)


# (N, C, H, W, k, stride): the channels_last whole-row blocks (stride 1, rows of 4-7 and of 8+
# pixels), the forward's zero-padded image copy (5x5 at stride 2) and the per-pixel border paths
# (stride 2).
NONFINITE_WEIGHT_CASES = [
    (2, 16, 9, 9, 3, 1),
    (1, 20, 6, 5, 3, 1),
    (1, 24, 7, 7, 7, 1),
    (1, 16, 12, 12, 5, 2),
]


@pytest.mark.parametrize("case", NONFINITE_WEIGHT_CASES)
def test_channels_last_nonfinite_weight_as_eager(case: tuple[int, ...]) -> None:
    """An inf and a NaN weight in channels_last fp32: forward and input gradient have NaN, inf and
    finite values exactly where PyTorch's own depthwise convolution has them. It skips a tap that
    falls in the padding; a kernel that multiplied the padding's zeros would turn 0 * inf into NaN
    along the borders."""
    n, c, h, w, k, stride = case
    x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(c, 1, k, k)
    weight[0, 0, 0, 0] = float("inf")
    weight[1, 0, k - 1, k - 1] = float("nan")
    ours = fastops.depthwise_conv2d(x, weight, None, stride, k // 2, 1)
    eager = torch.nn.functional.conv2d(x, weight, None, stride, k // 2, 1, c)
    g = torch.randn_like(eager)
    ours_dx = torch.ops.fastops.depthwise_conv2d_backward_input(
        g, weight, list(x.shape), [stride] * 2, [k // 2] * 4, [1, 1], True
    )
    eager_dx = torch.ops.aten.convolution_backward(
        g, x, weight, None, [stride] * 2, [k // 2] * 2, [1, 1], False, [0, 0], c, [True, False, False]
    )[0]
    for got, want in ((ours, eager), (ours_dx, eager_dx)):
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.isinf(), want.isinf())
        finite = want.isfinite()
        torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-5)


# (C, H, W, k): about 1 MiB of fp32 output per image, so that one image is written with plain
# stores and a batch of 32 (32 MiB) with streaming ones (streaming_stores_pay: 1.5x the L2 per
# thread). Whole-row blocks, odd widths (overlapping last blocks, border columns) and a 7x7 kernel.
STREAMING_CASES = [(64, 64, 64, 3), (64, 61, 67, 3), (32, 90, 91, 7)]


@pytest.mark.parametrize("case", STREAMING_CASES)
def test_channels_last_large_outputs_stream_the_same_values(case: tuple[int, ...]) -> None:
    """fp32 channels_last outputs too large for the caches go out in streaming stores: forward and
    input gradient of a large batch equal, bit for bit, those of its images one at a time."""
    c, h, w, k = case
    x = torch.randn(32, c, h, w).contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(c, 1, k, k), torch.randn(c)
    g = torch.randn_like(x)
    args = ([1, 1], [k // 2] * 4, [1, 1])

    def dgrad(grad: torch.Tensor) -> torch.Tensor:
        return torch.ops.fastops.depthwise_conv2d_backward_input(grad, weight, list(grad.shape), *args, True)

    whole = fastops.depthwise_conv2d(x, weight, bias, 1, k // 2, 1)
    one_by_one = torch.cat(
        [fastops.depthwise_conv2d(x[i : i + 1], weight, bias, 1, k // 2, 1) for i in range(32)]
    )
    assert torch.equal(whole, one_by_one)
    assert torch.equal(dgrad(g), torch.cat([dgrad(g[i : i + 1]) for i in range(32)]))
    want = torch.nn.functional.conv2d(x.double(), weight.double(), bias.double(), 1, k // 2, 1, c)
    torch.testing.assert_close(whole.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
@pytest.mark.parametrize("layout", ("contiguous", "channels_last"))
def test_half_outputs_are_the_fp32_sums_rounded(layout: str, dtype: torch.dtype) -> None:
    """CPU fp16/bf16 sum in fp32 like the fp32 kernels (same taps, same order) and narrow once: the
    forward and input gradient equal the fp32 kernels' results on the widened inputs, rounded by
    torch, bit for bit. Half the channels are scaled to 2^-130, so that bf16 results are subnormal
    (the AVX512_BF16 instruction would flush those; its vectors take at::vec's rounding) and fp16
    results are zero or subnormal too; a NaN and an inf input propagate as in fp32."""
    tiny = 2.0**-130 if dtype == torch.bfloat16 else 2.0**-20
    x, g = torch.randn(2, 32, 11, 13), torch.randn(2, 32, 11, 13)
    x[:, 16:] *= tiny
    g[:, 16:] *= tiny
    x[0, 3, 4, 5], x[1, 7, 2, 2] = float("nan"), float("inf")
    x, g = _layout(x.to(dtype), layout), _layout(g.to(dtype), layout)
    weight, bias = torch.randn(32, 1, 3, 3).to(dtype), torch.randn(32).to(dtype)
    bias[16:] = 0
    args = ([1, 1], [1, 1, 1, 1], [1, 1], layout == "channels_last")

    def both(xx: torch.Tensor, ww: torch.Tensor, bb: torch.Tensor, gg: torch.Tensor) -> list[torch.Tensor]:
        y = fastops.depthwise_conv2d(xx, ww, bb, 1, 1, 1)
        dx = torch.ops.fastops.depthwise_conv2d_backward_input(gg, ww, list(gg.shape), *args)
        return [y, dx]

    ours = both(x, weight, bias, g)
    widened = both(x.float(), weight.float(), bias.float(), g.float())
    assert any(((r != 0) & (r.abs() < torch.finfo(dtype).tiny)).any() for r in ours), "no subnormal result"
    for got, want in zip(ours, widened, strict=True):
        assert got.dtype == dtype
        assert torch.equal(got.isnan(), want.isnan())
        finite = ~want.isnan()
        assert torch.equal(got[finite], want.to(dtype)[finite])


# NCHW fp16/bf16 maps that the CPU runs through the fp32 paths in widened chunks: the register or
# channel-blocked path (by ISA), strided wide rows; chunks of 8 images (the register path's weight
# gradient blocks) plus one, and of part of the channels (16 + 4, 32 + 8).
HALF_THROUGH_FP32_CASES = [
    (9, 20, 14, 14, 3, 1, 1),
    (2, 40, 40, 40, 3, 2, 1),
    (3, 24, 12, 12, 7, 1, 3),
    (2, 17, 9, 15, 5, 2, 2),
]


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("case", HALF_THROUGH_FP32_CASES, ids=lambda c: "x".join(map(str, c)))
def test_nchw_half_through_the_fp32_paths_is_fp32_rounded(case: tuple[int, ...], dtype: torch.dtype) -> None:
    """Every pass of the chunked run equals the fp32 kernels' on the whole widened tensors, rounded once:
    the chunks sum the same taps in the same order, and the weight gradient's partial rows are the
    same rows."""
    n, c, h, w, k, s, p = case
    x, weight, bias = (
        torch.randn(n, c, h, w).to(dtype),
        torch.randn(c, 1, k, k).to(dtype),
        torch.randn(c).to(dtype),
    )
    args = ([s, s], [p] * 4, [1, 1])

    def passes(xx: torch.Tensor, ww: torch.Tensor, bb: torch.Tensor, gg: torch.Tensor) -> list[torch.Tensor]:
        y = fastops.depthwise_conv2d(xx, ww, bb, s, p)
        dx = torch.ops.fastops.depthwise_conv2d_backward_input(gg, ww, list(xx.shape), *args, False)
        dw, db = torch.ops.fastops.depthwise_conv2d_backward_weight(gg, xx, [k, k], *args)
        return [y, dx, dw, db]

    g = torch.randn(fastops.depthwise_conv2d(x, weight, bias, s, p).shape).to(dtype)
    ours = passes(x, weight, bias, g)
    widened = passes(x.float(), weight.float(), bias.float(), g.float())
    for name, got, want in zip(("y", "dx", "dw", "db"), ours, widened, strict=True):
        assert got.dtype == dtype, name
        assert torch.equal(got, want.to(dtype)), name


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
@pytest.mark.parametrize("layout", ("contiguous", "channels_last"))
def test_cuda_weight_gradient_is_bitwise_repeatable(layout: str) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        x = _layout(torch.randn(8, 40, 57, 31, device="cuda", dtype=dtype), layout)
        g = _layout(torch.randn(8, 40, 29, 16, device="cuda", dtype=dtype), layout)
        args = ([7, 7], [2, 2], [3, 3, 3, 3], [1, 1])
        first = torch.ops.fastops.depthwise_conv2d_backward_weight(g, x, *args)
        for _ in range(3):
            again = torch.ops.fastops.depthwise_conv2d_backward_weight(g, x, *args)
            assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


# ---- CUDA's NHWC weight gradient, run on the host -----------------------------------------------------
# fastops/depthwise_wgrad_nhwc.h and fastops/depthwise_rows_nhwc.h hold the per-thread bodies of CUDA
# kernels (the weight gradient with its first reduction stage; the row-block forward and stride-1
# input gradient) as host+device functions; these tests compile them for the CPU and run every task
# of the same grids (and the weight gradient's reductions in the kernel's order), so the index
# arithmetic, the image edges and the bookkeeping are checked without a GPU.

_HOST_WGRAD_SOURCE = r"""
#include <torch/extension.h>
#include <fastops/depthwise_rows_nhwc.h>
#include <fastops/depthwise_wgrad_nhwc.h>

namespace dwg = fastops::depthwise_wgrad;
namespace dwr = fastops::depthwise_rows;

template <typename T, int V, int K, int S>
void rows_tasks(const dwr::Args& a) {
  const int64_t tasks = a.N * a.OH * dwr::row_blocks<dwr::kPixels>(a.OW) * (a.C / V);
  for (int64_t t = 0; t < tasks; ++t) dwr::task<T, V, K, S, dwr::kPixels>(a, t);
}

template <typename T, int V>
void rows_size(const dwr::Args& a, int64_t k, int64_t s) {
  if (k == 3) s == 1 ? rows_tasks<T, V, 3, 1>(a) : rows_tasks<T, V, 3, 2>(a);
  else if (k == 5) s == 1 ? rows_tasks<T, V, 5, 1>(a) : rows_tasks<T, V, 5, 2>(a);
  else s == 1 ? rows_tasks<T, V, 7, 1>(a) : rows_tasks<T, V, 7, 2>(a);
}

// in (N, IH, IW, C), wt (k*k, C) fp32, bias (C) fp32 or empty: out (N, OH, OW, C) in in's dtype.
at::Tensor rows(at::Tensor in, at::Tensor wt, at::Tensor bias, int64_t k, int64_t s, int64_t oh, int64_t ow,
                int64_t pt, int64_t pl) {
  at::Tensor out = at::full({in.size(0), oh, ow, in.size(3)}, NAN, in.options());
  dwr::Args a{in.data_ptr(), wt.data_ptr<float>(), bias.numel() ? bias.data_ptr<float>() : nullptr, out.data_ptr(),
              in.size(0), in.size(1), in.size(2), in.size(3), oh, ow, (int)pt, (int)pl};
  if (in.scalar_type() == at::kFloat) rows_size<float, 4>(a, k, s);
  else if (in.scalar_type() == at::kHalf) rows_size<c10::Half, 8>(a, k, s);
  else rows_size<c10::BFloat16, 8>(a, k, s);
  return out;
}

template <typename T, int V, int K>
void run_tasks(const dwg::NhwcArgs& a) {
  const int64_t tasks = a.slots * (a.C / V);
  for (int64_t t = 0; t < tasks; ++t) {
    for (int kh = 0; kh < K; ++kh) dwg::nhwc_task<T, V, K>(a, t, kh);
  }
}

template <typename T, int V>
void run_size(const dwg::NhwcArgs& a, int64_t k) {
  if (k == 3) run_tasks<T, V, 3>(a);
  else if (k == 5) run_tasks<T, V, 5>(a);
  else run_tasks<T, V, 7>(a);
}

// x (N, H, W, C), g (N, OH, OW, C), geo = {sh, sw, pt, pl, dh, dw}: the (C, k*k + 1) fp32 sums.
at::Tensor emulate(at::Tensor x, at::Tensor g, int64_t k, std::vector<int64_t> geo, int64_t rows_per_slot) {
  const int64_t N = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3), OH = g.size(1), OW = g.size(2);
  const int64_t taps = k * k, width = C * (taps + 1), rows = N * OH;
  const int64_t slots = (rows + rows_per_slot - 1) / rows_per_slot;
  at::Tensor ws = at::full({slots, width}, NAN, x.options().dtype(at::kFloat));
  dwg::NhwcArgs a{x.data_ptr(), g.data_ptr(), ws.data_ptr<float>(), N, H, W, C, OH, OW,
                  (int)geo[0], (int)geo[1], (int)geo[2], (int)geo[3], (int)geo[4], (int)geo[5],
                  rows_per_slot, slots};
  if (x.scalar_type() == at::kFloat) run_size<float, 4>(a, k);
  else if (x.scalar_type() == at::kHalf) run_size<c10::Half, 8>(a, k);
  else run_size<c10::BFloat16, 8>(a, k);
  const int64_t groups = (slots + dwg::kGroupRows - 1) / dwg::kGroupRows;
  at::Tensor sums = at::empty({groups, width}, ws.options());
  for (int64_t group = 0; group < groups; ++group) {
    for (int64_t i = 0; i < width; ++i) dwg::sum_slot_group(ws.data_ptr<float>(), sums.data_ptr<float>(), slots, width, group, i);
  }
  at::Tensor out = at::empty({width}, ws.options());
  const float* s = sums.data_ptr<float>();
  for (int64_t i = 0; i < width; ++i) {  // as sum_rows_in_order_kernel: the groups in order
    float sum = 0.f;
    for (int64_t r = 0; r < groups; ++r) sum += s[r * width + i];
    out.data_ptr<float>()[i] = sum;
  }
  return out.view({C, taps + 1});
}
"""

_HOST_WGRAD: list = []


def _host_wgrad():  # noqa: ANN202 (a compiled module)
    if not _HOST_WGRAD:
        from pathlib import Path

        from torch.utils.cpp_extension import load_inline

        include = Path(__file__).resolve().parents[2] / "csrc" / "include"
        # load_inline rebuilds when its source text changes, not when a header it includes does: the
        # headers' hash goes into the source, so a cached build never hides a kernel change.
        headers = [include / "fastops" / name for name in ("depthwise_rows_nhwc.h", "depthwise_wgrad_nhwc.h")]
        digest = hashlib.sha256(b"".join(h.read_bytes() for h in headers)).hexdigest()
        _HOST_WGRAD.append(
            load_inline(
                "fastops_test_host_wgrad",
                cpp_sources=f"{_HOST_WGRAD_SOURCE}\n// headers {digest}\n",
                functions=["emulate", "rows"],
                extra_include_paths=[str(include)],
                extra_cflags=["-O2"],
            )
        )
    return _HOST_WGRAD[0]


# (N, C, H, W, k, stride, padding (top, bottom, left, right), dilation, rows_per_slot)
HOST_WGRAD_CASES = [
    (2, 8, 9, 7, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1),
    (3, 16, 11, 10, 3, (2, 2), (1, 0, 1, 0), (1, 1), 4),
    (2, 8, 13, 12, 5, (1, 2), (2, 2, 0, 3), (1, 1), 3),
    (1, 24, 16, 15, 7, (2, 1), (3, 3, 3, 3), (1, 1), 5),
    (2, 8, 15, 14, 3, (1, 1), (2, 2, 2, 2), (2, 2), 1000),
    (2, 8, 5, 4, 7, (1, 1), (3, 3, 3, 3), (1, 1), 2),  # the window wider than the image
    (65, 8, 3, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1), 1),  # one output pixel per image, 65 runs: 2 groups
    (2, 8, 7, 9, 5, (2, 1), (2, 1, 0, 4), (1, 1), 3),  # unit stride along rows, lopsided left/right pads
    (1, 8, 6, 12, 7, (1, 1), (3, 3, 5, 1), (1, 1), 2),  # the sliding window starting 5 columns outside
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", HOST_WGRAD_CASES, ids=lambda c: "x".join(map(str, c[:5])))
def test_nhwc_weight_gradient_kernel_on_the_host(case: tuple, dtype: torch.dtype) -> None:
    n, c, h, w, k, stride, pad, dil, rows_per_slot = case
    pt, pb, pl, pr = pad
    oh = (h + pt + pb - dil[0] * (k - 1) - 1) // stride[0] + 1
    ow = (w + pl + pr - dil[1] * (k - 1) - 1) // stride[1] + 1
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    x = torch.randn(n, c, h, w, generator=gen).to(dtype)
    g = torch.randn(n, c, oh, ow, generator=gen).to(dtype)
    x64 = x.double()
    w64 = torch.zeros(c, 1, k, k, dtype=torch.float64, requires_grad=True)
    y64 = reference.depthwise_conv2d(x64, w64, None, stride, pad, dil)
    assert y64.shape == g.shape
    (dw64,) = torch.autograd.grad(y64, w64, g.double())
    db64 = g.double().sum((0, 2, 3))
    nhwc = (x.permute(0, 2, 3, 1).contiguous(), g.permute(0, 2, 3, 1).contiguous())
    sums = _host_wgrad().emulate(*nhwc, k, [*stride, pt, pl, *dil], rows_per_slot)
    assert not sums.isnan().any(), "a workspace entry was never written"
    # fp32 sums of a few hundred products of fp16/bf16/fp32 values
    torch.testing.assert_close(sums[:, : k * k].double().view(c, 1, k, k), dw64, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(sums[:, k * k].double(), db64, rtol=1e-5, atol=1e-4)


# (N, C, H, W, k, stride, padding (top, bottom, left, right)); dilation 1
HOST_ROWS_CASES = [
    (2, 8, 9, 7, 3, 1, (1, 1, 1, 1)),
    (1, 16, 11, 10, 3, 2, (1, 1, 1, 1)),
    (2, 8, 13, 13, 5, 1, (2, 2, 2, 2)),
    (1, 8, 12, 9, 5, 2, (2, 1, 2, 1)),
    (1, 24, 14, 15, 7, 1, (3, 3, 3, 3)),
    (2, 8, 9, 11, 7, 2, (3, 3, 3, 3)),
    (1, 8, 4, 3, 7, 1, (3, 3, 3, 3)),  # the window wider than the image; one partial row block
    (1, 8, 6, 6, 3, 1, (0, 2, 0, 2)),  # asymmetric ("valid" on the top/left)
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", HOST_ROWS_CASES, ids=lambda c: "x".join(map(str, c[:6])))
def test_nhwc_row_block_kernel_on_the_host(case: tuple, dtype: torch.dtype) -> None:
    n, c, h, w, k, s, pad = case
    pt, pb, pl, pr = pad
    gen = torch.Generator().manual_seed(zlib.crc32(repr(case).encode()))
    x = torch.randn(n, c, h, w, generator=gen).to(dtype)
    weight = torch.randn(c, 1, k, k, generator=gen)
    bias = torch.randn(c, generator=gen)
    x64 = x.double().requires_grad_(True)
    y64 = reference.depthwise_conv2d(x64, weight.double(), bias.double(), s, pad, 1)
    oh, ow = y64.shape[2:]
    g = torch.randn(y64.shape, generator=gen).to(dtype)
    (dx64,) = torch.autograd.grad(y64, x64, g.double())

    def nhwc(t: torch.Tensor) -> torch.Tensor:
        return t.permute(0, 2, 3, 1).contiguous()

    ext = _host_wgrad()
    wt = weight.view(c, k * k).t().contiguous()
    y = ext.rows(nhwc(x), wt, bias, k, s, oh, ow, pt, pl).permute(0, 3, 1, 2)
    # fp32 sums of k*k products and the bias, rounded once to the dtype
    assert_close_to_reference(y, y64.detach(), rtol=None if dtype == torch.float32 else 1e-2)
    if s != 1:
        return
    # The stride-1 input gradient: a forward of g with the kernel flipped and pads k - 1 - pad.
    wt_flipped = weight.view(c, k * k).flip(1).t().contiguous()
    dx = ext.rows(nhwc(g), wt_flipped, torch.empty(0), k, 1, h, w, k - 1 - pt, k - 1 - pl).permute(0, 3, 1, 2)
    assert_close_to_reference(dx, dx64, rtol=None if dtype == torch.float32 else 1e-2)


# ---- CUDA: >2^31 elements ----------------------------------------------------------------------------


@pytest.mark.large
@cuda_only
@pytest.mark.parametrize("layout", ("channels_last", "contiguous"))
def test_cuda_more_than_2_31_elements(layout: str) -> None:
    """bf16 forward, input and weight gradients on an input past 2^31 elements (N*C*H*W; every
    per-sample plane is small, so only the batch offset outgrows 32 bits). Output and grad_x are
    checked against float64 on samples at the start, across element 2^31 and at the end; grad_weight
    and grad_bias (sums over all 2^31 positions) in full, chunk by chunk in float64."""
    n, c, h, w = 10701, 64, 56, 56  # 2^31 + 249856 elements
    args = ([1, 1], [1, 1, 1, 1], [1, 1])
    x = _layout(torch.randn(n, c, h, w, device="cuda", dtype=torch.bfloat16), layout)
    weight = torch.randn(c, 1, 3, 3, device="cuda", dtype=torch.bfloat16)
    g = torch.randn_like(x)
    y = torch.ops.fastops.depthwise_conv2d(x, weight, None, *args)
    dx = torch.ops.fastops.depthwise_conv2d_backward_input(
        g, weight, list(x.shape), *args, layout == "channels_last"
    )
    dw, db = torch.ops.fastops.depthwise_conv2d_backward_weight(g, x, [3, 3], *args)
    w64 = weight.double()
    for s in spot_slices(n, width=2, edge=(1 << 31) // (c * h * w)):
        x64 = x[s].double().requires_grad_(True)
        y64 = reference.depthwise_conv2d(x64, w64, None, 1, 1, 1)
        (dx64,) = torch.autograd.grad(y64, x64, g[s].double())
        eager_y = reference.depthwise_conv2d(x[s], weight, None, 1, 1, 1)
        eager_dx = torch.nn.grad.conv2d_input(x[s].shape, weight, g[s], 1, 1, 1, c)
        assert_close_to_reference(y[s], y64.detach(), eager=eager_y)
        assert_close_to_reference(dx[s], dx64, eager=eager_dx, factor=3.0)
    del y, dx
    want_w = torch.zeros(c, 1, 3, 3, dtype=torch.float64, device="cuda")
    abs_w = torch.zeros_like(want_w)
    want_b = torch.zeros(c, dtype=torch.float64, device="cuda")
    abs_b = torch.zeros_like(want_b)
    for r in range(0, n, 256):
        xs, gs = x[r : r + 256].double(), g[r : r + 256].double()
        want_w += torch.nn.grad.conv2d_weight(xs, w64.shape, gs, 1, 1, 1, c)
        abs_w += torch.nn.grad.conv2d_weight(xs.abs(), w64.shape, gs.abs(), 1, 1, 1, c)
        want_b += gs.sum((0, 2, 3))
        abs_b += gs.abs().sum((0, 2, 3))
    # fp32 partial sums over 2^31 / 64 positions a channel, then one bf16 rounding.
    for name, got, want, abs_sum in (("grad_weight", dw, want_w, abs_w), ("grad_bias", db, want_b, abs_b)):
        err = (got.double() - want).abs()
        assert (err <= 2**-8 * want.abs() + 1e-5 * abs_sum).all(), (
            f"{name}: worst error {err.max().item():.3e}"
        )


# ---- errors ------------------------------------------------------------------------------------------


def test_clear_errors() -> None:
    x = torch.randn(2, 4, 8, 8)
    w = torch.randn(4, 1, 3, 3)
    with pytest.raises(ValueError, match=r"expected weight of shape \(C, 1, kh, kw\)"):
        fastops.depthwise_conv2d(x, torch.randn(4, 3, 3))
    # a zero-size kernel is named as such, not as the negative padding "same" would compute for it
    for padding in ("same", 0):
        with pytest.raises(
            ValueError, match=r"expected a kernel of at least 1 x 1, got weight of shape \(4, 1, 0, 3\)"
        ):
            fastops.depthwise_conv2d(x, torch.randn(4, 1, 0, 3), padding=padding)
        with pytest.raises(
            ValueError, match=r"depthwise_separable_conv2d: expected a kernel of at least 1 x 1"
        ):
            fastops.depthwise_separable_conv2d(
                x, torch.randn(4, 1, 3, 0), None, torch.randn(6, 4, 1, 1), padding=padding
            )
    with pytest.raises(ValueError, match=r"channel multiplier"):
        fastops.depthwise_conv2d(x, torch.randn(8, 1, 3, 3))
    with pytest.raises(
        ValueError, match=r"expected padding of 4 to be ints >= 0 \(top, bottom, left, right\)"
    ):
        fastops.depthwise_conv2d(x, w, padding=(1, 1, -1, 0))
    with pytest.raises(ValueError, match=r"expected weight\.size\(0\) == channels of x \(4\)"):
        fastops.depthwise_conv2d(x, torch.randn(3, 1, 3, 3))
    with pytest.raises(ValueError, match=r"expected bias of shape \(4,\)"):
        fastops.depthwise_conv2d(x, w, torch.randn(5))
    with pytest.raises(ValueError, match=r"expected x to be 4-D"):
        fastops.depthwise_conv2d(torch.randn(4, 8, 8), w)
    with pytest.raises(ValueError, match=r"expected stride to be >= 1"):
        fastops.depthwise_conv2d(x, w, stride=0)
    with pytest.raises(ValueError, match=r"expected dilation to be >= 1"):
        fastops.depthwise_conv2d(x, w, dilation=(1, 0))
    with pytest.raises(ValueError, match=r"expected padding to be >= 0"):
        fastops.depthwise_conv2d(x, w, padding=-1)
    with pytest.raises(ValueError, match=r"expected padding to be an int, a pair, 'same' or 'valid'"):
        fastops.depthwise_conv2d(x, w, padding="full")
    with pytest.raises(TypeError, match=r"expected stride to be an int or a pair"):
        fastops.depthwise_conv2d(x, w, stride=(1, 2, 3))
    with pytest.raises(ValueError, match=r"'same' is not supported for strided"):
        fastops.depthwise_conv2d(x, w, stride=2, padding="same")
    with pytest.raises(RuntimeError, match=r"smaller than the dilated kernel"):
        fastops.depthwise_conv2d(torch.randn(1, 4, 2, 8), w)
    # dtype errors are TypeErrors from the Python face (as for every op); the C++ kernels below say the same
    with pytest.raises(TypeError, match=r"expected weight to have the dtype of x"):
        fastops.depthwise_conv2d(x, w.double())
    with pytest.raises(TypeError, match=r"expected x to be a float32"):
        fastops.depthwise_conv2d(x.int(), w.int())
    with pytest.raises(RuntimeError, match=r"expected weight to have the dtype of x"):
        torch.ops.fastops.depthwise_conv2d(x, w.double(), None, [1, 1], [0] * 4, [1, 1])
    with pytest.raises(RuntimeError, match=r"expected weight on the same device as x"):
        fastops.depthwise_conv2d(x, w.to("meta"))
    with pytest.raises(TypeError, match=r"expected x to be a torch\.Tensor"):
        fastops.depthwise_conv2d([1.0], w)  # type: ignore[arg-type]
    # the C++ kernels check the same things for direct torch.ops calls
    with pytest.raises(
        RuntimeError, match=r"fastops\.depthwise_conv2d: expected weight\.size\(0\) == channels"
    ):
        torch.ops.fastops.depthwise_conv2d(x, torch.randn(3, 1, 3, 3), None, [1, 1], [0] * 4, [1, 1])
    with pytest.raises(RuntimeError, match=r"expected stride to be 2 integers >= 1"):
        torch.ops.fastops.depthwise_conv2d(x, w, None, [0, 1], [0] * 4, [1, 1])
    with pytest.raises(RuntimeError, match=r"expected padding to be 4 integers >= 0"):
        torch.ops.fastops.depthwise_conv2d(x, w, None, [1, 1], [0, -1, 0, 0], [1, 1])
    with pytest.raises(RuntimeError, match=r"backward_input: expected grad_out of shape"):
        torch.ops.fastops.depthwise_conv2d_backward_input(
            torch.randn(2, 4, 5, 5), w, [2, 4, 8, 8], [1, 1], [1] * 4, [1, 1], False
        )
    with pytest.raises(RuntimeError, match=r"backward_weight: expected grad_out of shape"):
        torch.ops.fastops.depthwise_conv2d_backward_weight(
            torch.randn(2, 4, 5, 5), x, [3, 3], [1, 1], [1] * 4, [1, 1]
        )


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs a CUDA device")
def test_cuda_device_mismatch_and_float64() -> None:
    x = torch.randn(2, 4, 8, 8, device="cuda")
    with pytest.raises(RuntimeError, match=r"expected weight on the same device as x"):
        fastops.depthwise_conv2d(x, torch.randn(4, 1, 3, 3))
    with pytest.raises(RuntimeError, match=r"expected weight on the same device as x"):
        torch.ops.fastops.depthwise_conv2d(x, torch.randn(4, 1, 3, 3), None, [1, 1], [0] * 4, [1, 1])
    with pytest.raises(TypeError, match=r"expected x to be a float32"):
        fastops.depthwise_conv2d(x.double(), torch.randn(4, 1, 3, 3, device="cuda", dtype=torch.float64))


def test_autocast_takes_a_low_precision_x_with_fp32_weights() -> None:
    """In an autocast model a bf16 activation meets fp32 weights; the autocast kernel casts them, so
    the check before dispatch must not refuse the mismatch (it did, in every timm model)."""
    x = torch.randn(2, 4, 8, 8).bfloat16()
    w, b = torch.randn(4, 1, 3, 3), torch.randn(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = fastops.depthwise_conv2d(x, w, b, padding=1)
        eager = torch.nn.functional.conv2d(x, w, b, padding=1, groups=4)
    assert ours.dtype == eager.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), eager.float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(TypeError, match=r"expected weight to have the dtype of x \(torch.bfloat16\)"):
        fastops.depthwise_conv2d(x, w, b, padding=1)  # outside autocast the mismatch is an error


def test_meta_device_gives_shapes_as_f_conv2d() -> None:
    """Shape-only calls (meta-device init, FLOP counters) as the other ops take them: the eager
    check before dispatch asked autocast about the meta device, which raises."""
    x = torch.empty(2, 6, 9, 8, device="meta")
    w = torch.empty(6, 1, 3, 3, device="meta")
    for layout in (torch.contiguous_format, torch.channels_last):
        xl = x.contiguous(memory_format=layout)
        got = fastops.depthwise_conv2d(xl, w, None, stride=2, padding=1)
        want = torch.nn.functional.conv2d(xl, w, None, 2, 1, 1, 6)
        assert got.is_meta and got.shape == want.shape
        assert got.is_contiguous(memory_format=layout)
    module = fastops.nn.DepthwiseConv2d(6, 5, padding=2, device="meta")
    assert module(x).shape == x.shape and module(x).is_meta
    sep = fastops.nn.DepthwiseSeparableConv2d(6, 4, 3, padding=1, device="meta")
    assert sep(x.contiguous(memory_format=torch.channels_last)).shape == (2, 4, 9, 8)


def test_the_weight_gradient_has_the_weights_strides() -> None:
    """DDP's gradient buckets are views in each Parameter's layout (the gradient layout contract): a
    gradient in other strides costs a copy per step and a warning. A channels_last [C, 1, kh, kw]
    weight differs from a contiguous one only in its size-1 dim's stride."""
    weight = torch.randn(8, 1, 3, 3).to(memory_format=torch.channels_last).requires_grad_()
    x = torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last)
    for inputs in (x, x.contiguous()):
        weight.grad = None
        fastops.depthwise_conv2d(inputs, weight, padding=1).sum().backward()
        assert weight.grad is not None and weight.grad.stride() == weight.stride()
        stock = weight.detach().clone().requires_grad_()
        torch.nn.functional.conv2d(inputs, stock, padding=1, groups=8).sum().backward()
        torch.testing.assert_close(weight.grad, stock.grad, rtol=1e-5, atol=1e-5)
