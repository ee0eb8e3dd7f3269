"""Adam/AdamW step: fastops.optim.FusedAdamW vs torch.optim.AdamW for-loop, foreach, fused, compile.

Param lists (shapes only; no model is built): every parameter of GPT-2 small (124.4M params, 148
tensors), of ResNet-50 (25.6M params, 161 tensors, most of them small BatchNorm vectors), and one
huge tensor. Each provider gets fresh params with random grads and its own optimizer state; the
timed call is one opt.step(). On the CPU every param, grad and state tensor starts on a 4 KiB
boundary (page_aligned_empty), so every provider sees the same relative placement of its streams.
Bytes counted: the minimal traffic of AdamW, 7 x itemsize per param (read p, g, m, v; write p, m, v =
28 B for fp32).

    python -m benchmarks.bench_fused_adam [--device cpu|cuda] [--quick] [--no-compile]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator

import torch

import fastops
from benchmarks import common


def gpt2_small_shapes(vocab: int = 50257, ctx: int = 1024, d: int = 768, layers: int = 12) -> list[tuple]:
    shapes: list[tuple] = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,)]
        shapes += [(4 * d, d), (d,)]
    return shapes + [(d,), (d,)]


def resnet50_shapes() -> list[tuple]:
    shapes: list[tuple] = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(width, inplanes, 1, 1), (width,), (width,)]
            shapes += [(width, width, 3, 3), (width,), (width,)]
            shapes += [(4 * width, width, 1, 1), (4 * width,), (4 * width,)]
            if b == 0:
                shapes += [(4 * width, inplanes, 1, 1), (4 * width,), (4 * width,)]
            inplanes = 4 * width
    return shapes + [(1000, 2048), (1000,)]


def numel(shapes: list[tuple]) -> int:
    total = 0
    for s in shapes:
        n = 1
        for d in s:
            n *= d
        total += n
    return total


def page_aligned_empty(shape: tuple, device: str, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor starting on a 4 KiB boundary (on the CPU; elsewhere as allocated).

    The CPU kernels run at a speed that depends on where the four streams (param, grad, exp_avg,
    exp_avg_sq) sit relative to each other modulo 4 KiB (store-to-load aliasing, cache sets): up to
    15% for one kernel on one layout. With glibc's mmap switched off, each provider's state lands at
    its own offsets, set by the allocation order, so one provider could be timed on a lucky layout
    and another on an unlucky one. Page-aligning every stream gives every provider the same layout:
    the one glibc's default mmap gives tensors this large."""
    if device != "cpu":
        return torch.empty(shape, device=device, dtype=dtype)
    n = math.prod(shape)
    buf = torch.empty(n + 4096 // dtype.itemsize, device=device, dtype=dtype)
    start = (-buf.data_ptr()) % 4096 // dtype.itemsize
    return buf[start : start + n].view(shape)


def make_params(shapes: list[tuple], device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    params = []
    for s in shapes:
        p = page_aligned_empty(s, device, dtype).uniform_(-0.1, 0.1).requires_grad_(True)
        p.grad = page_aligned_empty(s, device, dtype).uniform_(-1e-3, 1e-3)
        params.append(p)
    return params


def with_aligned_state(opt: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """opt with its Adam state created now, page-aligned (see page_aligned_empty), in the form the
    optimizer would create at its first step (torch.optim.AdamW and fastops.optim.FusedAdamW both
    create state only for a param whose state is empty). CPU params only: elsewhere each optimizer
    keeps its own (where its step tensor lives differs between torch's variants off the CPU)."""
    for group in opt.param_groups:
        for p in group["params"]:
            if p.device.type != "cpu":
                continue
            opt.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device),
                "exp_avg": page_aligned_empty(tuple(p.shape), p.device.type, p.dtype).zero_(),
                "exp_avg_sq": page_aligned_empty(tuple(p.shape), p.device.type, p.dtype).zero_(),
            }
    return opt


PROVIDERS: dict[str, Callable[[list[torch.Tensor]], torch.optim.Optimizer]] = {
    "fastops": lambda ps: with_aligned_state(fastops.optim.FusedAdamW(ps, lr=1e-3)),
    "torch_forloop": lambda ps: with_aligned_state(torch.optim.AdamW(ps, lr=1e-3, foreach=False)),
    "torch_foreach": lambda ps: with_aligned_state(torch.optim.AdamW(ps, lr=1e-3, foreach=True)),
    "torch_fused": lambda ps: with_aligned_state(torch.optim.AdamW(ps, lr=1e-3, fused=True)),
}


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    dtype = getattr(torch, args.dtype)
    huge = (1 << 24) if args.quick else (1 << 26)
    param_lists = {
        "gpt2-small": gpt2_small_shapes(layers=2 if args.quick else 12),
        "resnet50": resnet50_shapes(),
        "one-tensor": [(huge,)],
    }
    for case, shapes in param_lists.items():
        n = numel(shapes)
        size = f"{n / 1e6:.1f}M params / {len(shapes)} tensors"
        nbytes = 7 * n * torch.empty((), dtype=dtype).element_size()
        # One set of params and grads shared by every provider (each has its own optimizer state):
        # the work per step does not depend on the values, and memory stays at 1 + providers copies.
        # The runner's warm-up creates each optimizer's state (and compiles).
        params = make_params(shapes, args.device, dtype)
        steps: dict[str, Callable[[], object]] = {name: f(params).step for name, f in PROVIDERS.items()}
        steps["compile"] = torch.compile(PROVIDERS["torch_foreach"](params).step)
        yield common.BenchCase(
            case, "step", dtype, size, steps, nbytes=nbytes, derived=lambda t: {"reps": len(t)}
        )
        del params, steps
        torch._dynamo.reset()


def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
    text = (
        "AdamW(lr=1e-3, weight_decay=1e-2), one opt.step() timed; bytes = 7 x itemsize per param. "
        "compile = torch.compile(torch.optim.AdamW(foreach=True).step). Providers are timed in rounds "
        "(one step of each per round) on one shared set of params and grads. "
    )
    if args.device == "cpu":
        text += (
            "% roofline can pass 100% on the CPU: the copy that sets the roofline pays a write-allocate "
            "read of its destination that the byte count does not show, while Adam writes only lines it "
            "has just read (params and moments are updated in place). Providers run interleaved, so "
            "other load on the cores hits them alike; but contention changes the ratios: torch's fused "
            "CPU kernel runs one parallel region per tensor, each waiting for its slowest thread, while "
            "fastops runs one region per dtype over all tensors, so on a busy machine torch_fused falls "
            "behind by a multiple, on an idle one by ~10%. Every param, grad and state tensor starts "
            "on a 4 KiB boundary, so all providers run on the same relative placement of their four "
            "streams (the speed of both kernels depends on it; see page_aligned_empty). "
        )
    return text


def main() -> None:
    common.run_benchmark(
        "fused_adam",
        cases,
        description=__doc__.splitlines()[0],
        check_pairs=(("fastops", "torch_fused"),),
        options=lambda parser: parser.add_argument(
            "--dtype", default="float32", choices=["float32", "bfloat16"]
        ),
        notes=notes,
        warmup=2,
        min_reps=7,
        max_reps=200,
    )


if __name__ == "__main__":
    main()
