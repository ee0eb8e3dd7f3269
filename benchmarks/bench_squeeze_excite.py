"""squeeze_excite: fastops.nn.SqueezeExcite vs the eager SE block vs torch.compile of it.

Cases: the SE blocks of EfficientNet-B0 (SiLU, sigmoid) and MobileNetV3 (ReLU, hardsigmoid) at their
stage shapes for a 224x224 input, NCHW and channels_last, fp32 and bf16; forward, and forward +
backward (gradients of x and of the four FC parameters).
  eager:   x * gate(fc2(act(fc1(x.mean((2, 3))))))[:, :, None, None] with nn.Linear FCs.
  compile: torch.compile of that block.

Bytes counted (minimal traffic, elements of x): fwd reads x twice (pool, scale) and writes y
(3 x itemsize); the backward reads g and x once (the reduction), reads g and writes dx (4 x
itemsize); fwd+bwd 7 x itemsize. Eager's backward moves about twice that (g * x written and reduced;
g * s written; the pool gradient expanded and added).

    python -m benchmarks.bench_squeeze_excite [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import torch
from torch import nn

import fastops
from benchmarks import common

OP = "squeeze_excite"

# (case, channels, reduced channels, side, act, gate) at a 224x224 input.
SHAPES = [
    ("effnet_b0_s1", 32, 8, 112, nn.SiLU, nn.Sigmoid),
    ("effnet_b0_s2", 144, 6, 56, nn.SiLU, nn.Sigmoid),
    ("effnet_b0_s3", 240, 10, 28, nn.SiLU, nn.Sigmoid),
    ("effnet_b0_s5", 672, 28, 14, nn.SiLU, nn.Sigmoid),
    ("effnet_b0_s7", 1152, 48, 7, nn.SiLU, nn.Sigmoid),
    ("mbv3_small_s1", 16, 8, 56, nn.ReLU, nn.Hardsigmoid),
    ("mbv3_small_s3", 96, 24, 14, nn.ReLU, nn.Hardsigmoid),
    ("mbv3_small_s5", 576, 144, 7, nn.ReLU, nn.Hardsigmoid),
]
QUICK = ["effnet_b0_s2", "effnet_b0_s5", "mbv3_small_s3"]


class SEBlock(nn.Module):
    """The eager block (docs/squeeze_excite.md's plain SE block)."""

    def __init__(self, channels: int, reduced: int, act: nn.Module, gate: nn.Module) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2, self.gate = (
            nn.Linear(channels, reduced),
            act,
            nn.Linear(reduced, channels),
            gate,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.act(self.fc1(x.mean((2, 3))))))[:, :, None, None]


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=0, help="batch size (default: 8 on CPU, 64 on CUDA)")
    parser.add_argument("--shapes", default="", help="comma-separated case names (default: all; --quick: 3)")


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    device = args.device
    batch = args.batch or (8 if device == "cpu" else 64)
    for name, c, r, side, act, gate in common.select_shapes(
        SHAPES, args.shapes, QUICK if args.quick else None
    ):
        for layout in ("nchw", "channels_last"):
            fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            for dtype in (torch.float32, torch.bfloat16):
                torch.manual_seed(0)
                eager = SEBlock(c, r, act(), gate()).to(device=device, dtype=dtype)
                blocks = {
                    "fastops": fastops.nn.SqueezeExcite.from_torch(eager),
                    "eager": eager,
                    "compile": torch.compile(eager, dynamic=False),
                }
                x = torch.randn(batch, c, side, side, device=device, dtype=dtype).contiguous(
                    memory_format=fmt
                )
                g = torch.randn_like(x)
                n = x.numel() * x.element_size()
                size = f"{batch}x{c}x{side}x{side}-{layout}"
                fwd = {k: (lambda b=b, x=x: b(x)) for k, b in blocks.items()}
                yield common.BenchCase(name, "fwd", dtype, size, fwd, nbytes=3 * n, grad=False)
                steps = common.module_grad_steps(blocks, x, g)
                yield common.BenchCase(name, "fwd+bwd", dtype, size, steps, nbytes=7 * n)


def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
    text = (
        "Bytes: fwd 3, fwd+bwd 7 x itemsize per element of x (the (N, C) tensors and FC weights are "
        "noise). fwd+bwd: torch.autograd.grad of x and the four FC parameters for a fixed upstream "
        "gradient. Batch "
        f"{args.batch or (8 if args.device == 'cpu' else 64)}, 224x224-input stage shapes."
    )
    if args.device == "cpu":
        text += (
            common.allocation_note(args)
            + f", {torch.get_num_threads()} torch thread(s). The CPU (2 cores) is shared with other jobs "
            "while this runs: expect noise of 10-30%; every case times its providers interleaved, call by "
            "call, so load falls on all of them alike: read medians with p20/p80."
        )
    return text


def main() -> None:
    common.run_benchmark(OP, cases, description=__doc__.splitlines()[0], options=options, notes=notes)


if __name__ == "__main__":
    main()
