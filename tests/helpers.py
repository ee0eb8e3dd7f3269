"""Shared test helpers: devices, sample inputs, tolerances and the 2x rule.

Tolerance policy (STYLE.md): fp32/fp64 close to assert_close defaults against a float64 reference;
fp16/bf16 by the 2x rule — our error against the float64 reference is at most `factor` times the
error PyTorch's own eager op makes in the same dtype (factor 2 for outputs, 3 for gradients), plus a
floor of one unit in the last place of the dtype so an exactly-right eager op does not demand zero
error. Failures report the worst element and where it is.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
HALF_DTYPES = (torch.float16, torch.bfloat16)
DTYPES = (torch.float32, *HALF_DTYPES)

# CUDA cases are always collected (and skipped without a GPU), so a CPU run shows what a GPU run covers.
devices = pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device"))],
)
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
# More elements than a 32-bit index holds, plus a tail that is not a whole 16-byte vector.
LARGE_NUMEL = (1 << 31) + 4099


def spot_slices(n: int, width: int = 1 << 16, edge: int = 1 << 31) -> list[slice]:
    """Where a result of n > 2^31 elements goes wrong if an index is 32 bits: the start, both sides of
    element 2^31 (`edge`: where it falls along a dimension that is not the flat one), and the tail.
    (Checking all of it in float64 would not fit next to the result.)"""
    assert edge < n, "the tensor does not reach the edge it is meant to test"
    return [slice(0, width), slice(edge - width, min(n, edge + width)), slice(n - width, n)]


dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))

# Shapes that hit every path: empty, scalar-like, below / across / far above a vector width, odd.
SHAPES = [(0,), (1,), (7,), (16,), (33,), (1000,), (4097,), (3, 5, 7), (2, 0, 3), (64, 129), (2, 3, 17, 19)]


def layouts(t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """t as views of several layouts: contiguous, transposed, strided slice, storage offset 1,
    channels_last (4-D), and an expanded (stride-0) view."""
    yield "contiguous", t
    if t.dim() >= 2:
        yield "transposed", t.transpose(0, -1)
    if t.numel() > 0 and t.shape[-1] > 1:
        yield "sliced", t[..., ::2]
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    flat[1:] = t.reshape(-1)
    yield "offset1", flat[1:].view(t.shape)
    if t.dim() == 4:
        yield "channels_last", t.contiguous(memory_format=torch.channels_last)
    if t.dim() >= 1 and t.shape[0] == 1:
        yield "expanded", t.expand(3, *t.shape[1:])


def ulp_floor(dtype: torch.dtype) -> float:
    return {torch.float16: 2**-10, torch.bfloat16: 2**-7, torch.float32: 2**-23, torch.float64: 2**-52}[dtype]


def _describe_worst(
    actual: torch.Tensor, expected: torch.Tensor, err: torch.Tensor, bound: torch.Tensor
) -> str:
    excess = (err - bound).reshape(-1)
    idx = int(torch.argmax(torch.nan_to_num(excess, nan=float("inf"))))
    where = (
        tuple(int(i) for i in torch.unravel_index(torch.tensor(idx), actual.shape)) if actual.dim() else ()
    )
    return (
        f"worst element at {where}: got {actual.reshape(-1)[idx].item()!r}, "
        f"reference {expected.reshape(-1)[idx].item()!r}, error {err.reshape(-1)[idx].item():.3e} "
        f"> allowed {bound.reshape(-1)[idx].item():.3e}"
    )


def assert_same_nonfinite(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """NaN where the reference has NaN, the same infinities where it has infinities."""
    a, e = actual.double().cpu(), expected.double().cpu()
    assert torch.equal(torch.isnan(a), torch.isnan(e)), f"NaN pattern differs: got {a}, expected {e}"
    inf = torch.isinf(e)
    assert torch.equal(torch.isinf(a), inf) and torch.equal(a[inf], e[inf]), "infinities differ"


def assert_close_to_reference(
    actual: torch.Tensor,
    reference64: torch.Tensor,
    *,
    eager: torch.Tensor | None = None,
    factor: float = 2.0,
    rtol: float | None = None,
    atol: float | None = None,
    floor: torch.Tensor | None = None,
) -> None:
    """actual (any dtype) against a float64 reference.

    fp32/fp64: |actual - ref| <= atol + rtol * |ref| (defaults: assert_close's for the dtype).
    fp16/bf16 with `eager` given: the 2x rule, elementwise with a per-tensor slack —
    |actual - ref| <= factor * max(|eager - ref|, ulp(dtype) * |ref|) + tiny absolute floor, and never
    below `floor` (elementwise) when given, e.g. factor x the error of a correctly rounded
    computation where eager's own error is luckier than that at some elements.
    Non-finite values must match exactly (NaN where NaN, same infinities).
    """
    assert actual.shape == reference64.shape, f"shape {tuple(actual.shape)} != {tuple(reference64.shape)}"
    a = actual.detach().double().cpu()
    r = reference64.detach().double().cpu()
    assert_same_nonfinite(a, r)
    # Non-finite reference elements matched above; zero them so the bound below skips them.
    finite = torch.isfinite(r)
    a = torch.where(finite, a, 0.0)
    r = torch.where(finite, r, 0.0)
    if a.numel() == 0:
        return
    err = (a - r).abs()
    if actual.dtype in HALF_DTYPES and eager is not None:
        e = torch.where(finite, eager.detach().double().cpu(), 0.0)
        eager_err = torch.nan_to_num((e - r).abs(), nan=float("inf"), posinf=float("inf"))
        ulp = ulp_floor(actual.dtype)
        bound = factor * torch.maximum(eager_err, ulp * r.abs()) + 1e-6
        if floor is not None:
            bound = torch.maximum(bound, floor.detach().double().cpu())
    else:
        default_rtol, default_atol = {
            torch.float64: (1e-7, 1e-7),
            torch.float32: (1.3e-6, 1e-5),
            torch.float16: (1e-3, 1e-5),
            torch.bfloat16: (1.6e-2, 1e-5),
        }[actual.dtype]
        rtol = default_rtol if rtol is None else rtol
        atol = default_atol if atol is None else atol
        bound = atol + rtol * r.abs()
    bad = ~(err <= bound)
    if bool(bad.any()):
        raise AssertionError(
            f"{int(bad.sum())}/{err.numel()} elements out of tolerance; " + _describe_worst(a, r, err, bound)
        )


def leave_spawned_worker() -> None:
    """End a spawned gloo worker whose work is done and written, without the interpreter's teardown.
    torch's teardown after gloo and torch.distributed.checkpoint now and then aborts the process at
    exit ("terminate called without an active exception", no Python frame left), also with
    torch.optim.AdamW in place of ours: 2 of 20 runs of the FSDP2 test at da2977d, and once in CI
    (2026-11-28). A worker that fails before this point still raises and exits non-zero."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
