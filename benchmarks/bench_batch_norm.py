"""batch_norm: fastops.nn.BatchNorm2d vs nn.BatchNorm2d (eager) vs torch.compile of it, training mode.

Cases: the BatchNorm2d layers of the digits ConvNet (batch 64: 32x16x16, 64x8x8, 128x4x4) and of a
ResNet/MobileNet at 224 (batch 16: 64x56x56, 96x28x28, 320x7x7), NCHW and channels_last, fp32 and
bf16; forward (training: batch statistics and the running-statistics update), and forward + backward
(gradients of x, weight and bias).

Bytes counted (minimal traffic): fwd reads x once and writes y (2 x itemsize per element: the
statistics pass could read x from cache); fwd+bwd adds a read of g and x and a write of dx (5 x
itemsize). Our kernels read x twice in the forward and g and x twice in the backward, the second
time from L2 when a channel (NCHW) fits there.

    python -m benchmarks.bench_batch_norm [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import torch
from torch import nn

import fastops
from benchmarks import common

OP = "batch_norm"

# (case, batch, channels, side)
SHAPES = [
    ("digits_s1", 64, 32, 16),
    ("digits_s2", 64, 64, 8),
    ("digits_s3", 64, 128, 4),
    ("r224_56", 16, 64, 56),
    ("r224_28", 16, 96, 28),
    ("r224_7", 16, 320, 7),
]
QUICK = ["digits_s1", "digits_s3", "r224_28"]


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--shapes", default="", help="comma-separated case names (default: all; --quick: 3)")
    parser.add_argument(
        "--layouts", default="nchw,channels_last", help="comma-separated: nchw, channels_last"
    )
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated torch dtypes")


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    device = args.device
    for name, batch, c, side in common.select_shapes(SHAPES, args.shapes, QUICK if args.quick else None):
        for layout in args.layouts.split(","):
            fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
                torch.manual_seed(0)
                eager = nn.BatchNorm2d(c).to(device)  # float32 parameters and statistics, as under autocast
                ours = fastops.nn.BatchNorm2d.from_torch(nn.BatchNorm2d(c).to(device))
                ours.backend = "fastops"  # our kernels, whatever the policy says
                modules = {"fastops": ours, "eager": eager, "compile": torch.compile(eager, dynamic=False)}
                x = torch.randn(batch, c, side, side, device=device, dtype=dtype).contiguous(
                    memory_format=fmt
                )
                g = torch.randn_like(x)
                n = x.numel() * x.element_size()
                size = f"{batch}x{c}x{side}x{side}-{layout}"
                fwd = {k: (lambda m=m, x=x: m(x)) for k, m in modules.items()}
                fwd["copy"] = common.same_size_copy(x)
                yield common.BenchCase(name, "fwd", dtype, size, fwd, nbytes=2 * n, grad=False)
                steps = common.module_grad_steps(modules, x, g)
                yield common.BenchCase(name, "fwd+bwd", dtype, size, steps, nbytes=5 * n)


def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
    text = (
        "Training mode throughout (batch statistics, running statistics updated every call). Parameters "
        "and running statistics float32 also for bf16 x (as under autocast). Bytes: fwd 2, fwd+bwd 5 x "
        "itemsize per element of x."
    )
    if args.device == "cpu":
        text += (
            common.allocation_note(args)
            + f", {torch.get_num_threads()} torch thread(s). Providers are timed interleaved, call by call; "
            "read medians with p20/p80."
        )
    return text


def main() -> None:
    common.run_benchmark(OP, cases, description=__doc__.splitlines()[0], options=options, notes=notes)


if __name__ == "__main__":
    main()
