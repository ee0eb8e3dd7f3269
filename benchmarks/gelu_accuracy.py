"""Exhaustive fp32 accuracy of the erf-form gelu and its gradient against float64.

Walks every fp32 bit pattern of [lo, hi] (or every stride-th one) through fastops.gelu and
fastops' gelu_backward and reports, against fastops.reference.gelu in float64 and its autograd
gradient (x Phi(x) and Phi(x) + x phi(x)):
the forward's largest error in ulp of the correctly rounded result (normal results only), and the
gradient's largest relative error (its root x = -0.7518 included) and absolute error. The numbers
the docs quote for the CPU bulk (|x| <= 7) come from

    python -m benchmarks.gelu_accuracy --lo -7 --hi 7

(about 2.2e9 values: a few minutes on two cores). Run under FASTOPS_CPU_CAPABILITY=avx2 for the
AVX2 level. Not a test: tests/ops/test_gelu.py holds the bounds on a dense grid.
"""

from __future__ import annotations

import argparse
import math
import struct
import time

import torch

import fastops
from benchmarks import common
from fastops import reference

_CHUNK = 1 << 22


def _bits(value: float) -> int:
    return struct.unpack("<i", struct.pack("<f", abs(value)))[0]


def _patterns(lo: float, hi: float, stride: int):
    """fp32 values of [lo, hi] in chunks: non-negative ones up to hi, then negative ones down to lo."""
    for sign, bound in ((1.0, hi), (-1.0, -lo)):
        if bound < 0:
            continue
        top = _bits(bound)
        for start in range(0, top + 1, _CHUNK * stride):
            stop = min(start + _CHUNK * stride, top + 1)
            yield sign * torch.arange(start, stop, stride, dtype=torch.int32).view(torch.float32)


def measure(lo: float, hi: float, stride: int) -> dict[str, float]:
    worst = {
        "fwd_ulp": 0.0,
        "fwd_ulp_at": 0.0,
        "grad_rel": 0.0,
        "grad_rel_at": 0.0,
        "grad_abs": 0.0,
        "values": 0,
    }
    tiny = torch.finfo(torch.float32).tiny
    for x in _patterns(lo, hi, stride):
        x64 = x.double().requires_grad_(True)
        ref = reference.gelu(x64)
        (grad_ref,) = torch.autograd.grad(ref.sum(), x64)
        ref = ref.detach()
        y = fastops.gelu(x).double()
        ref32 = ref.float().abs()
        normal = ref32 >= tiny
        spacing = (torch.nextafter(ref32, torch.tensor(math.inf)) - ref32).double()
        ulp = ((y - ref).abs() / spacing).masked_fill(~normal, 0.0)
        if ulp.max().item() > worst["fwd_ulp"]:
            worst["fwd_ulp"], worst["fwd_ulp_at"] = ulp.max().item(), x[ulp.argmax()].item()
        grad = torch.ops.fastops.gelu_backward(torch.ones_like(x), x, "none").double()
        err = (grad - grad_ref).abs()
        rel = (err / grad_ref.abs()).masked_fill(grad_ref == 0, 0.0)
        if rel.max().item() > worst["grad_rel"]:
            worst["grad_rel"], worst["grad_rel_at"] = rel.max().item(), x[rel.argmax()].item()
        worst["grad_abs"] = max(worst["grad_abs"], err.max().item())
        worst["values"] += x.numel()
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lo", type=float, default=-7.0)
    parser.add_argument("--hi", type=float, default=7.0)
    parser.add_argument("--stride", type=int, default=1, help="every stride-th fp32 bit pattern")
    args = parser.parse_args()
    env = common.environment("cpu")
    start = time.perf_counter()
    worst = measure(args.lo, args.hi, args.stride)
    print(f"gelu erf form, fp32, every {args.stride} of the fp32 values in [{args.lo}, {args.hi}]")
    print("  " + ", ".join(f"{k}: {v}" for k, v in env.items() if k != "clock"))
    print(f"  values: {worst['values']}, {time.perf_counter() - start:.0f} s")
    print(f"  forward: max {worst['fwd_ulp']:.2f} ulp (x = {worst['fwd_ulp_at']!r})")
    print(f"  gradient: max relative error {worst['grad_rel']:.3g} (x = {worst['grad_rel_at']!r}),")
    print(f"            max absolute error {worst['grad_abs']:.3g}")


if __name__ == "__main__":
    main()
