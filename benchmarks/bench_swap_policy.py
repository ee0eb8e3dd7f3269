"""Never slower: every module swap_modules puts into a model, against the torch module it replaces.

For each module kind (depthwise conv, squeeze-excite, GELU, Linear+GELU) at the shapes of its own
bench, both layouts where it has them, fp32 and bf16, inference (forward under no_grad) and training
(forward + backward to the input and the parameters), three providers timed interleaved:

* ``torch``: the stock module (nn.Conv2d(groups=C), the plain SE block, nn.GELU, Linear -> GELU)
* ``fastops``: its fastops twin with ``backend="fastops"``: our kernels, always
* ``auto``: the twin as swap_modules leaves it (``backend="auto"``), tuned for the case first
  (``fastops.tune``: the kernel choice measured on this machine, or read from its cache)

``auto`` must never be below 0.97x ``torch`` (``--check`` tests that: the tuner keeps ours only when
it measured faster, so ``auto`` is ours or torch's, up to timing noise). Where ``fastops`` is below
1.0x, the tuner picks torch's kernel there (and the kernel may want a fix). The twins share the stock
module's Parameters, as the swap makes them.

    python -m benchmarks.bench_swap_policy [--modules depthwise,squeeze_excite,gelu,linear_gelu]
        [--dtypes float32,bfloat16] [--batch N] [--threads N] [--check]
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterator

import torch
from torch import nn

import fastops
from benchmarks import common
from benchmarks.bench_depthwise_conv2d import CONVNEXT_ATTO, DIGITS_CONVNET, MOBILENET_V2
from benchmarks.bench_squeeze_excite import SHAPES as SE_SHAPES
from benchmarks.bench_squeeze_excite import SEBlock
from fastops import policy, tuner
from fastops.nn import GELU, DepthwiseConv2d, LinearGELU, SqueezeExcite

OP = "swap_policy"
MODULES = ("depthwise", "squeeze_excite", "gelu", "linear_gelu")
MODES = ("infer", "train")


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modules", default=",".join(MODULES), help=f"comma-separated, of {MODULES}")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes")
    parser.add_argument("--batch", type=int, default=16, help="batch of the conv / SE inputs")
    parser.add_argument("--shapes", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--layouts", default="nchw,channels_last", help="of the conv and SE inputs")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {MODES}")
    common.add_warm_cache_option(parser)


def _providers(
    stock: nn.Module, twin: Callable[[nn.Module], nn.Module], x: torch.Tensor, mode: str
) -> dict[str, Callable[[], object]]:
    ours, auto = twin(stock), twin(stock)
    ours.backend, auto.backend = "fastops", "auto"
    params = [p for p in stock.parameters()]
    leaf = x.detach().requires_grad_(mode == "train")
    fastops.tune(auto, leaf, training=mode == "train")
    g = torch.randn_like(stock(leaf)) if mode == "train" else None

    def call(m: nn.Module) -> Callable[[], object]:
        if mode == "infer":
            return lambda: m(leaf)
        return lambda: torch.autograd.grad(m(leaf), [leaf, *params], g)

    return {"auto": call(auto), "fastops": call(ours), "torch": call(stock)}


def _layouts(x: torch.Tensor, wanted: str) -> Iterator[tuple[str, torch.Tensor]]:
    if "nchw" in wanted.split(","):
        yield "nchw", x.contiguous()
    if "channels_last" in wanted.split(","):
        yield "channels_last", x.contiguous(memory_format=torch.channels_last)


def _case(
    name: str, layout: str, mode: str, dtype: torch.dtype, size: str, providers: dict
) -> common.BenchCase:
    return common.BenchCase(
        f"{name} {layout}".strip(),
        mode,
        dtype,
        size,
        providers,
        grad=mode == "train",
        extra={"layout": layout},
    )


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    # "auto" must mean the kernel choice as users get it, not a backend forced for the whole process.
    os.environ.pop(policy.BACKEND_ENV, None)
    common.empty_kernel_choice_cache(args)
    device, batch = args.device, args.batch
    wanted, modes = args.modules.split(","), args.modes.split(",")
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        factory = {"device": device, "dtype": dtype}
        if "depthwise" in wanted:
            for name, c, h, k, stride in common.select_shapes(
                MOBILENET_V2 + CONVNEXT_ATTO + DIGITS_CONVNET, args.shapes
            ):
                conv = nn.Conv2d(c, c, k, stride, k // 2, groups=c, **factory)
                for layout, x in _layouts(torch.randn(batch, c, h, h, **factory), args.layouts):
                    for mode in modes:
                        providers = _providers(conv, DepthwiseConv2d.from_torch, x, mode)
                        yield _case(
                            name, layout, mode, dtype, f"{batch}x{c}x{h}x{h} k{k} s{stride}", providers
                        )
        if "squeeze_excite" in wanted:
            for name, c, r, side, act, gate in common.select_shapes(SE_SHAPES, args.shapes):
                block = SEBlock(c, r, act(), gate()).to(**factory)
                for layout, x in _layouts(torch.randn(batch, c, side, side, **factory), args.layouts):
                    for mode in modes:
                        providers = _providers(block, SqueezeExcite.from_torch, x, mode)
                        yield _case(name, layout, mode, dtype, f"{batch}x{c}x{side}x{side}", providers)
        if "gelu" in wanted:
            for shape in [(1 << 16,), (1 << 20,), (2048, 3072)]:
                x = torch.randn(shape, **factory)
                for mode in modes:
                    providers = _providers(nn.GELU(), GELU.from_torch, x, mode)
                    yield _case("gelu", "", mode, dtype, "x".join(map(str, shape)), providers)
        if "linear_gelu" in wanted:
            for tokens, d in [(1024, 192), (1024, 384)]:
                pair = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU()).to(**factory)
                x = torch.randn(tokens, d, **factory)
                for mode in modes:
                    providers = _providers(pair, lambda seq: LinearGELU.from_torch(seq[0], seq[1]), x, mode)
                    yield _case("linear_gelu", "", mode, dtype, f"{tokens}x{d}->{4 * d}", providers)


def summary(args: argparse.Namespace, results: list[common.Result]) -> str:
    """Per row group: fastops and auto against torch; rows where either is below 1.0x are marked."""
    groups: dict[tuple[str, str, str, str], dict[str, float]] = {}
    for r in results:
        groups.setdefault((r.case, r.direction, r.dtype, r.size), {})[r.provider] = r.median_ms
    lines = [
        "| case | mode | dtype | size | torch ms | fastops vs torch | auto vs torch | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    speedups: dict[str, list[float]] = {"fastops": [], "auto": []}
    for (case, mode, dtype, size), ms in groups.items():
        row = {p: ms["torch"] / ms[p] for p in ("fastops", "auto")}
        for p, s in row.items():
            speedups[p].append(s)
        mark = "auto < 1" if row["auto"] < 1.0 else ("fastops < 1" if row["fastops"] < 1.0 else "")
        lines.append(
            f"| {case} | {mode} | {dtype} | {size} | {ms['torch']:.4f} | {row['fastops']:.2f}x | "
            f"{row['auto']:.2f}x | {mark} |"
        )
    for p, values in speedups.items():
        if values:
            geomean = math.exp(sum(math.log(v) for v in values) / len(values))
            lines.append(f"\n{p} vs torch: geomean {geomean:.2f}x, min {min(values):.2f}x over {len(values)}")
    return "\n".join(lines)


def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    spent = tuner.stats()
    choices = tuner.describe()
    return (
        f"ATen CPU capability {torch.backends.cpu.get_cpu_capability()}, fastops {policy.cpu_isa()}, "
        f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}; load average at the end "
        f"{load} (1, 5, 15 min). Tuning: {spent.measured} kinds of input timed in {spent.seconds:.1f} s "
        "(the rest came from the kernel-choice cache).\n\n"
        + summary(args, results)
        + "\n\nKernel choices cached on this machine (fastops.tuner):\n\n"
        + ("\n".join(f"- {line}" for line in choices) if choices else "- none")
        + common.allocation_note(args)
    )


def main() -> None:
    common.run_benchmark(
        OP,
        cases,
        description=__doc__.splitlines()[0],
        options=options,
        notes=notes,
        summary=summary,
        check_pairs=(("auto", "torch"),),
        check_minimum=0.97,
        min_time=0.3,
    )


if __name__ == "__main__":
    main()
