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

import torch
import torch.nn.functional as F

import fastops
from benchmarks import common

OP = "gelu"


def _grad_input(fn, x: torch.Tensor, g: torch.Tensor, extra: tuple = ()):  # noqa: ANN001, ANN202
    """A closure timing forward + backward of fn(x, *extra) for the upstream gradient g."""
    leaves = (
        x.detach().clone().requires_grad_(True),
        *(e.detach().clone().requires_grad_(True) for e in extra),
    )

    def run() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(fn(*leaves), leaves, g)

    return run


def gelu_cases(args, device: str, roofline: float, min_time: float) -> list[common.Result]:  # noqa: ANN001
    results: list[common.Result] = []
    sizes = [(1 << 20,), (4096, 4096)] if args.quick else [(1 << 16,), (1 << 20,), (1 << 22,), (4096, 4096)]
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

        providers = {"fastops": (ours, ours_bwd), "eager": (eager, eager_bwd)}
        if not args.no_compile:
            providers["compile"] = (common.maybe_compile(eager, True), common.maybe_compile(eager_bwd, True))
        for dtype in (torch.float32, torch.bfloat16):
            for shape in sizes:
                n = 1
                for s in shape:
                    n *= s
                size = "x".join(str(s) for s in shape)
                x = (torch.randn(shape, device=device) * 2).to(dtype)
                g = torch.randn(shape, device=device).to(dtype)
                item = x.element_size()
                for name, (fwd, bwd) in providers.items():
                    with torch.no_grad():
                        r_f = common.measure(
                            OP,
                            case,
                            "fwd",
                            dtype,
                            size,
                            name,
                            lambda f=fwd, x=x: f(x),
                            device,
                            2 * n * item,
                            roofline,
                            min_time,
                        )
                        r_b = common.measure(
                            OP,
                            case,
                            "bwd",
                            dtype,
                            size,
                            name,
                            lambda b=bwd, g=g, x=x: b(g, x),
                            device,
                            3 * n * item,
                            roofline,
                            min_time,
                        )
                    r_fb = common.measure(
                        OP,
                        case,
                        "fwd+bwd",
                        dtype,
                        size,
                        name,
                        _grad_input(fwd, x, g),
                        device,
                        5 * n * item,
                        roofline,
                        min_time,
                    )
                    results += [r_f, r_b, r_fb]
                    print(
                        f"{case:4s} {r_f.dtype:8s} {size:>9s} {name:8s} fwd {r_f.median_ms:8.3f}  bwd {r_b.median_ms:8.3f}"
                        f"  fwd+bwd {r_fb.median_ms:8.3f} ms",
                        flush=True,
                    )
    return results


def bias_gelu_cases(args, device: str, roofline: float, min_time: float) -> list[common.Result]:  # noqa: ANN001
    results: list[common.Result] = []
    shapes = {"none": [(4096, 4096)] if args.quick else [(1024, 4096), (4096, 4096)], "tanh": [(4096, 4096)]}
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

        providers = {"fastops": ours, "eager": eager}
        if not args.no_compile:
            providers["compile"] = common.maybe_compile(eager, True)
        bwd_providers = {
            "fastops": lambda g, x, b, h, a=approximate: torch.ops.fastops.bias_gelu_backward(g, x, b, a),
            "eager": lambda g, x, b, h: eager_bwd(g, h),
        }
        if not args.no_compile:
            compiled_bwd = common.maybe_compile(eager_bwd, True)
            bwd_providers["compile"] = lambda g, x, b, h, c=compiled_bwd: c(g, h)
        for dtype in (torch.float32, torch.bfloat16):
            for rows, cols in shape_list:
                n = rows * cols
                size = f"{rows}x{cols}"
                x = torch.randn(rows, cols, device=device).to(dtype)
                b = torch.randn(cols, device=device).to(dtype)
                g = torch.randn(rows, cols, device=device).to(dtype)
                h = x + b
                item = x.element_size()
                for name, fwd in providers.items():
                    with torch.no_grad():
                        r_f = common.measure(
                            OP,
                            case,
                            "fwd",
                            dtype,
                            size,
                            name,
                            lambda f=fwd, x=x, b=b: f(x, b),
                            device,
                            2 * n * item,
                            roofline,
                            min_time,
                        )
                        bwd = bwd_providers[name]
                        r_b = common.measure(
                            OP,
                            case,
                            "bwd",
                            dtype,
                            size,
                            name,
                            lambda f=bwd, g=g, x=x, b=b, h=h: f(g, x, b, h),
                            device,
                            3 * n * item,
                            roofline,
                            min_time,
                        )
                    r_fb = common.measure(
                        OP,
                        case,
                        "fwd+bwd",
                        dtype,
                        size,
                        name,
                        _grad_input(fwd, x, g, (b,)),
                        device,
                        5 * n * item,
                        roofline,
                        min_time,
                    )
                    results += [r_f, r_b, r_fb]
                    print(
                        f"{case:14s} {r_f.dtype:8s} {size:>9s} {name:8s} fwd {r_f.median_ms:8.3f}  bwd "
                        f"{r_b.median_ms:8.3f}  fwd+bwd {r_fb.median_ms:8.3f} ms",
                        flush=True,
                    )
    return results


def mlp_cases(args, device: str, roofline: float, min_time: float) -> list[common.Result]:  # noqa: ANN001
    """Linear(d, 4d) -> GELU -> Linear(4d, d), forward + backward, with the activation's share."""
    results: list[common.Result] = []
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
        blocks = {"fastops": fused, "eager": seq}
        activation = {
            "fastops": _grad_input(lambda t, b: fastops.bias_gelu(t, b), pre, g_hidden, (bias,)),
            "eager": _grad_input(lambda t, b: F.gelu(t + b), pre, g_hidden, (bias,)),
        }
        if not args.no_compile:
            blocks["compile"] = torch.compile(seq, dynamic=False)
            compiled_act = common.maybe_compile(lambda t, b: F.gelu(t + b), True)
            activation["compile"] = _grad_input(compiled_act, pre, g_hidden, (bias,))
        size = f"{tokens}x{d}"
        for name, block in blocks.items():
            xi = x.detach().clone().requires_grad_(True)

            def step(block=block, xi=xi, g=g) -> tuple[torch.Tensor, ...]:  # noqa: ANN001
                return torch.autograd.grad(block(xi), [xi, *block.parameters()], g)

            r = common.measure(OP, "mlp", "fwd+bwd", dtype, size, name, step, device, 0, roofline, min_time)
            act_median, _, _ = common.quantiles(common.time_ms(activation[name], device, min_time=min_time))
            r.extra["activation_ms"] = round(act_median, 4)
            r.extra["activation_share_pct"] = round(100 * act_median / r.median_ms, 1)
            results.append(r)
            print(
                f"mlp {r.dtype:8s} {size} {name:8s} fwd+bwd {r.median_ms:8.3f} ms, activation {act_median:7.3f} ms "
                f"({r.extra['activation_share_pct']}%)",
                flush=True,
            )
    return results


def main() -> None:
    parser = common.base_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=0, help="CPU: torch.set_num_threads (0: torch's default)"
    )
    args = parser.parse_args()
    device = args.device
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if device == "cpu" and not args.fresh_pages:
        common.fair_cpu_allocation()
    min_time = 0.3 if args.quick else args.min_time
    roofline = common.copy_roofline_gbps(device, min_time=min_time)
    print(f"copy roofline on {device}: {roofline:.1f} GB/s", flush=True)
    results = gelu_cases(args, device, roofline, min_time)
    results += bias_gelu_cases(args, device, roofline, min_time)
    results += mlp_cases(args, device, roofline, min_time)
    notes = (
        "Bytes: fwd 2, bwd 3, fwd+bwd 5 x itemsize per activation element (bias terms are O(features)). "
        "bwd rows time the backward kernels alone (eager: aten.gelu_backward on the saved x + bias, then "
        "grad_x.sum(0) for grad_bias). mlp rows: Linear(d, 4d) -> GELU -> Linear(4d, d) forward + backward; "
        "activation_ms / activation_share_pct time the activation (forward + backward) alone at the hidden shape."
    )
    if device == "cpu":
        notes += (
            " CPU allocations: "
            + (
                "fresh pages (glibc default)"
                if args.fresh_pages
                else "glibc mmap disabled, freed blocks reused"
            )
            + f", {torch.get_num_threads()} torch thread(s)"
            + ". The CPU is shared with other jobs while this runs: expect noise of 10-30%; read medians with p20/p80."
        )
    table = common.format_table(results, roofline)
    csv_path, md_path = common.write_results(OP, device, results, roofline, args.out, args.tag, notes)
    print(table)
    print(f"wrote {csv_path} and {md_path}")


if __name__ == "__main__":
    main()
