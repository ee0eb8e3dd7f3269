"""clipped_log: fastops vs eager torch.log(torch.clamp(x, eps)) vs torch.compile of it.

Bytes counted (minimal traffic): forward reads x and writes y (2 * itemsize per element); forward +
backward also reads g and x and writes dx (5 * itemsize). Eager runs clamp, log, and their two
backward kernels, so it moves about twice that; compile fuses them like we do.

    python benchmarks/bench_clipped_log.py [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import torch

import fastops
from benchmarks import common

EPS = 1e-6


def eager(x: torch.Tensor) -> torch.Tensor:
    return torch.log(torch.clamp(x, min=EPS))


def ours(x: torch.Tensor) -> torch.Tensor:
    # exact mode: the same gradient contract as the eager expression
    return fastops.clipped_log(x, EPS, straight_through=False)


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    device = args.device
    sizes = [1 << 16, 1 << 20, 1 << 24] if args.quick else [1 << 16, 1 << 20, 1 << 24, 1 << 26]
    if device == "cuda" and not args.quick:
        sizes.append(1 << 28)  # 256M: launch and tail costs amortized, the roofline regime
    providers = {"fastops": ours, "eager": eager, "compile": common.compiled(eager)}
    for dtype in (torch.float32, torch.bfloat16):
        for n in sizes:
            x = (torch.rand(n, device=device, dtype=torch.float32) * 4 - 1).to(dtype)
            g = torch.randn(n, device=device, dtype=dtype)
            size, item = common.human_size(n), x.element_size()
            fwd = {name: (lambda fn=fn, x=x: fn(x)) for name, fn in providers.items()}
            fwd["copy"] = common.same_size_copy(x)
            yield common.BenchCase("1-D", "fwd", dtype, size, fwd, nbytes=2 * n * item, grad=False)
            xg = x.detach().clone().requires_grad_(True)
            fwd_bwd = {
                name: (lambda fn=fn, xg=xg, g=g: torch.autograd.grad(fn(xg), xg, g)[0])
                for name, fn in providers.items()
            }
            yield common.BenchCase("1-D", "fwd+bwd", dtype, size, fwd_bwd, nbytes=5 * n * item)
            del x, g, xg, fwd, fwd_bwd


def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
    return (
        "fastops runs with straight_through=False (the eager expression's own gradient). "
        "Bytes: fwd 2 x itemsize / element, fwd+bwd 5 x itemsize / element. copy rows: x copied into a "
        "preallocated tensor, the forward's bytes with no math: what this size reaches on this device."
        + common.allocation_note(args)
    )


def main() -> None:
    common.run_benchmark("clipped_log", cases, description=__doc__.splitlines()[0], notes=notes)


if __name__ == "__main__":
    main()
