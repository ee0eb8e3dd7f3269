"""gelu and bias_gelu: fastops vs eager PyTorch vs torch.compile of the eager expression.

Cases:
  gelu (erf and tanh forms): eager F.gelu;                 fwd, bwd, fwd+bwd.
  bias_gelu (2-D rows x features): eager F.gelu(x + bias); fwd, bwd, fwd+bwd.
    eager bwd = aten.gelu_backward on the saved x + bias, then grad_bias = grad_x.sum(0).
  mlp: Linear(d, 4d) -> GELU -> Linear(4d, d), fwd+bwd, to show the activation's share of a block:
    eager nn.Sequential, fastops LinearGELU + Linear, compile of the eager block.

Bytes counted (minimal traffic, elements of the activation): fwd reads x, writes y (2 x itemsize);
bwd reads grad and x, writes grad_x (3 x itemsize); fwd+bwd 5 x itemsize; bias and grad_bias are
O(features) and not counted. Eager bias_gelu moves about twice that (x + bias is written and read
back; grad_bias re-reads grad_x).

    python -m benchmarks.bench_gelu [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

import fastops
from benchmarks import common

OP = "gelu"


def _grad_input(fn, x: torch.Tensor, g: torch.Tensor, extra: tuple = ()):
    """A closure timing forward + backward of fn(x, *extra) for the upstream gradient g."""
    leaves = (
        x.detach().clone().requires_grad_(True),
        *(e.detach().clone().requires_grad_(True) for e in extra),
    )

    def run() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(fn(*leaves), leaves, g)

    return run


def gelu_cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    device = args.device
    if args.quick:
        sizes = [(1 << 20,), (4096, 4096)]
    elif device == "cuda":  # large enough to reach the copy roofline
        sizes = [(1 << 20,), (1 << 24,), (1 << 26,), (1 << 28,), (4096, 4096)]
    else:
        sizes = [(1 << 16,), (1 << 20,), (1 << 22,), (4096, 4096)]
    for approximate in ("none", "tanh"):
        case = "erf" if approximate == "none" else "tanh"

        def eager(t: torch.Tensor, a: str = approximate) -> torch.Tensor:
            return F.gelu(t, approximate=a)

        def ours(t: torch.Tensor, a: str = approximate) -> torch.Tensor:
            return fastops.gelu(t, a)

        def eager_bwd(g: torch.Tensor, t: torch.Tensor, a: str = approximate) -> torch.Tensor:
            return torch.ops.aten.gelu_backward(g, t, approximate=a)

        def ours_bwd(g: torch.Tensor, t: torch.Tensor, a: str = approximate) -> torch.Tensor:
            return torch.ops.fastops.gelu_backward(g, t, a)

        providers = {
            "fastops": (ours, ours_bwd),
            "eager": (eager, eager_bwd),
            "compile": (common.compiled(eager), common.compiled(eager_bwd)),
        }
        for dtype in (torch.float32, torch.bfloat16):
            for shape in sizes:
                n = math.prod(shape)
                size = "x".join(str(s) for s in shape)
                x = (torch.randn(shape, device=device) * 2).to(dtype)
                g = torch.randn(shape, device=device).to(dtype)
                item = x.element_size()
                fwd_fns = {name: (lambda f=f, x=x: f(x)) for name, (f, _) in providers.items()}
                fwd_fns["copy"] = common.same_size_copy(x)
                yield common.BenchCase(case, "fwd", dtype, size, fwd_fns, nbytes=2 * n * item, grad=False)
                bwd_fns = {name: (lambda b=b, g=g, x=x: b(g, x)) for name, (_, b) in providers.items()}
                yield common.BenchCase(case, "bwd", dtype, size, bwd_fns, nbytes=3 * n * item, grad=False)
                fb_fns = {name: _grad_input(f, x, g) for name, (f, _) in providers.items()}
                yield common.BenchCase(case, "fwd+bwd", dtype, size, fb_fns, nbytes=5 * n * item)


def bias_gelu_cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    device = args.device
    big = [(16384, 4096)] if device == "cuda" and not args.quick else []
    shapes = {
        "none": [(4096, 4096)] if args.quick else [(1024, 4096), (4096, 4096), *big],
        "tanh": [(4096, 4096), *big],
    }
    for approximate, shape_list in shapes.items():
        case = "bias_gelu_erf" if approximate == "none" else "bias_gelu_tanh"

        def eager(t: torch.Tensor, b: torch.Tensor, a: str = approximate) -> torch.Tensor:
            return F.gelu(t + b, approximate=a)

        def ours(t: torch.Tensor, b: torch.Tensor, a: str = approximate) -> torch.Tensor:
            return fastops.bias_gelu(t, b, a)

        def eager_bwd(
            g: torch.Tensor, h: torch.Tensor, a: str = approximate
        ) -> tuple[torch.Tensor, torch.Tensor]:
            dx = torch.ops.aten.gelu_backward(g, h, approximate=a)
            return dx, dx.sum(0)

        providers = {"fastops": ours, "eager": eager, "compile": common.compiled(eager)}
        compiled_bwd = common.compiled(eager_bwd)
        bwd_providers = {
            "fastops": lambda g, x, b, h, a=approximate: torch.ops.fastops.bias_gelu_backward(g, x, b, a),
            "eager": lambda g, x, b, h: eager_bwd(g, h),
            "compile": lambda g, x, b, h, c=compiled_bwd: c(g, h),
        }
        for dtype in (torch.float32, torch.bfloat16):
            for rows, cols in shape_list:
                n = rows * cols
                size = f"{rows}x{cols}"
                x = torch.randn(rows, cols, device=device).to(dtype)
                b = torch.randn(cols, device=device).to(dtype)
                g = torch.randn(rows, cols, device=device).to(dtype)
                h = x + b
                item = x.element_size()
                fwd_fns = {name: (lambda f=f, x=x, b=b: f(x, b)) for name, f in providers.items()}
                yield common.BenchCase(case, "fwd", dtype, size, fwd_fns, nbytes=2 * n * item, grad=False)
                bwd_fns = {
                    name: (lambda f=f, g=g, x=x, b=b, h=h: f(g, x, b, h)) for name, f in bwd_providers.items()
                }
                yield common.BenchCase(case, "bwd", dtype, size, bwd_fns, nbytes=3 * n * item, grad=False)
                fb_fns = {name: _grad_input(f, x, g, (b,)) for name, f in providers.items()}
                yield common.BenchCase(case, "fwd+bwd", dtype, size, fb_fns, nbytes=5 * n * item)


def mlp_cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    """Linear(d, 4d) -> GELU -> Linear(4d, d), forward + backward; then the activation alone at the
    hidden shape, which `activation_share` folds into the mlp rows."""
    device = args.device
    tokens, d = (512, 512) if device == "cpu" else (8192, 2048)
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        seq = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        seq = seq.to(device=device, dtype=dtype)
        fused = torch.nn.Sequential(fastops.nn.LinearGELU.from_torch(seq[0], seq[1]), seq[2])
        x = torch.randn(tokens, d, device=device, dtype=dtype)
        g = torch.randn(tokens, d, device=device, dtype=dtype)
        hidden = seq[0](x).detach()
        g_hidden = torch.randn_like(hidden)
        bias = seq[0].bias.detach()
        pre = (hidden - bias).contiguous()  # what LinearGELU's matmul produces (no bias)
        blocks = {"fastops": fused, "eager": seq, "compile": torch.compile(seq, dynamic=False)}
        steps = {}
        for name, block in blocks.items():
            xi = x.detach().clone().requires_grad_(True)

            def step(block=block, xi=xi, g=g) -> tuple[torch.Tensor, ...]:
                return torch.autograd.grad(block(xi), [xi, *block.parameters()], g)

            steps[name] = step
        yield common.BenchCase("mlp", "fwd+bwd", dtype, f"{tokens}x{d}", steps)
        compiled_act = common.compiled(lambda t, b: F.gelu(t + b))
        activation = {
            "fastops": _grad_input(lambda t, b: fastops.bias_gelu(t, b), pre, g_hidden, (bias,)),
            "eager": _grad_input(lambda t, b: F.gelu(t + b), pre, g_hidden, (bias,)),
            "compile": _grad_input(compiled_act, pre, g_hidden, (bias,)),
        }
        yield common.BenchCase("mlp_activation", "fwd+bwd", dtype, f"{tokens}x{4 * d}", activation)


CASES = ("erf", "tanh", "bias_gelu_erf", "bias_gelu_tanh", "mlp")


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cases",
        default=",".join(CASES),
        help=f"comma-separated subset of {','.join(CASES)} (default: all)",
    )


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    wanted = {c.strip() for c in args.cases.split(",") if c.strip()}
    if unknown := wanted - set(CASES):
        raise SystemExit(f"bench_gelu: unknown --cases {sorted(unknown)}; expected a subset of {list(CASES)}")
    groups = (
        (gelu_cases, {"erf", "tanh"}),
        (bias_gelu_cases, {"bias_gelu_erf", "bias_gelu_tanh"}),
        (mlp_cases, {"mlp"}),
    )
    for make, names in groups:
        if names & wanted:  # a generator allocates its inputs before yielding: skip unwanted ones whole
            yield from (c for c in make(args) if c.case.removesuffix("_activation") in wanted)


def activation_share(results: list[common.Result]) -> list[common.Result]:
    """The mlp rows gain the activation's time (forward + backward alone, at the hidden shape) and
    its share of the block; the activation's own rows are not kept."""
    acts = {(r.dtype, r.provider): r for r in results if r.case == "mlp_activation"}
    for r in results:
        if r.case == "mlp":
            act = acts[(r.dtype, r.provider)]
            r.extra["activation_ms"] = round(act.median_ms, 4)
            r.extra["activation_share_pct"] = round(100 * act.median_ms / r.median_ms, 1)
    return [r for r in results if r.case != "mlp_activation"]


# Why the numbers are what they are (CPU, AVX-512); printed with the results. Development measurements:
# one thread, 1M fp32 elements, min of 30-40 calls, same machine as the tables, other jobs running.
CPU_ANALYSIS = """
**Cost model, erf form (per 16 fp32 lanes, AVX-512).** Eager's vectorized erf is Abramowitz-Stegun 7.1.26
(`1 - t P5(t) exp(-z^2)`, absolute error 1.5e-7, so `1 + erf` loses every digit below x ~ -5.4): ~28
vector instructions plus one division, and it runs about as fast as the divider allows (0.39-0.42 ms per
1M fp32 on one thread, against 0.31 ms for a copy). An accurate tail needs Q(u) to fp32 relative precision,
which takes a degree-9 polynomial in t = 1/(1 + a u) instead of degree 5, and exp(-x^2/2) with the low
part of x^2: predicted ~36 instructions + one division, i.e. ~0.75x eager if bound by the FMA ports.
Measured steps (forward, 1 thread, 1M fp32): Sleef expf + rcp14/Newton reciprocal 0.88 ms -> our own exp
(Cody-Waite + degree-6 + VSCALEFPS, low part folded into r) 0.66 ms -> true division instead of
rcp14 + Newton (the divider is idle otherwise) 0.62 ms; eager 0.39-0.42 ms. The two halves alone: exp
part without Q 0.41 ms, Q without exp 0.41 ms; unrolling 4 vectors per iteration changed nothing
(throughput-bound, not latency-bound). So the fp32 erf forward stays below eager on this CPU: that is
the price of a correct negative tail (eager: up to 100% relative error; ours: < 8 ulp everywhere).
fp16/bf16 forwards use a degree-6 Q and a degree-4 e^r (~1e-5 relative, far below their ulp):
0.75 -> 0.60 ms per 1M bf16 (eager 0.42-0.46). Backward: Phi and phi share one exp(-x^2/2), where eager
evaluates erf and exp separately, so our backward is faster than eager's while exact to fp32.
**tanh form:** eager calls Sleef's tanhf (2.1 ms per 1M fp32); ours is x / (1 + exp(-2|y|)) with a blend,
0.8 ms, and has no cancellation either. **bias_gelu:** eager writes x + bias and reads it back (and
re-reads grad_x for grad_bias); we form it in registers and reduce grad_bias in the same pass.
"""


def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
    text = (
        "Bytes: fwd 2, bwd 3, fwd+bwd 5 x itemsize per activation element (bias terms are O(features)). "
        "copy rows (gelu fwd): x copied into a preallocated tensor, the forward's bytes with no math: what "
        "this size reaches on this device. "
        "bwd rows time the backward kernels alone (eager: aten.gelu_backward on the saved x + bias, then "
        "grad_x.sum(0) for grad_bias). mlp rows: Linear(d, 4d) -> GELU -> Linear(4d, d) forward + backward; "
        "activation_ms / activation_share_pct time the activation (forward + backward) alone at the hidden shape."
    )
    if args.device == "cpu":
        text += (
            common.allocation_note(args)
            + f", {torch.get_num_threads()} torch thread(s)"
            + ". The CPU (2 cores) is shared with other jobs while this runs: expect noise of 10-30%; every "
            "case times its providers interleaved, call by call, so load falls on all of them alike; calls "
            "longer than ~1 ms can still lose a whole scheduler slice (~5 ms) to another job, which "
            "inflates a slower provider's median more than a faster one's: read medians with p20/p80.\n"
            + CPU_ANALYSIS
        )
    return text


def main() -> None:
    common.run_benchmark(
        OP, cases, description=__doc__.splitlines()[0], options=options, notes=notes, finish=activation_share
    )


if __name__ == "__main__":
    main()
