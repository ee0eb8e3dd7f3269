"""depthwise_conv2d: fastops vs eager F.conv2d(groups=C) (NCHW and channels_last) vs torch.compile.

Shapes: the depthwise layers of MobileNetV2 (3x3, 224x224 input) and ConvNeXt-atto (7x7), batch 32
on the CPU (256 on CUDA). Passes: fwd (forward), dgrad (input gradient), wgrad (weight + bias
gradient), full (forward + all three gradients). Eager's dgrad / wgrad are
aten.convolution_backward with the matching output mask, which is what autograd runs.

Counted work (minimal): FLOPs 2 * N*C*OH*OW*kh*kw per pass (full = 3 passes); bytes: fwd reads x
and writes y, dgrad reads g and writes dx, wgrad reads x and g (weights are negligible).

    python -m benchmarks.bench_depthwise_conv2d [--device cpu|cuda] [--quick] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

import fastops
from benchmarks import common

# (name, C, H, kernel, stride): MobileNetV2's distinct depthwise layers, then ConvNeXt-atto's.
MOBILENET_V2 = [
    ("mbv2.c32.112.s1", 32, 112, 3, 1),
    ("mbv2.c96.112.s2", 96, 112, 3, 2),
    ("mbv2.c144.56.s1", 144, 56, 3, 1),
    ("mbv2.c144.56.s2", 144, 56, 3, 2),
    ("mbv2.c192.28.s1", 192, 28, 3, 1),
    ("mbv2.c192.28.s2", 192, 28, 3, 2),
    ("mbv2.c384.14.s1", 384, 14, 3, 1),
    ("mbv2.c576.14.s1", 576, 14, 3, 1),
    ("mbv2.c576.14.s2", 576, 14, 3, 2),
    ("mbv2.c960.7.s1", 960, 7, 3, 1),
]
CONVNEXT_ATTO = [
    ("cnxa.c40.56.k7", 40, 56, 7, 1),
    ("cnxa.c80.28.k7", 80, 28, 7, 1),
    ("cnxa.c160.14.k7", 160, 14, 7, 1),
    ("cnxa.c320.7.k7", 320, 7, 7, 1),
]
# The depthwise layers of fastops.train.model.ConvNet as the main job builds it (digits: 16x16 input,
# width 32; the bench_train config): small maps and channel counts, run at batch 64. Used by
# bench_swap_policy (not part of this benchmark's own default list).
DIGITS_CONVNET = [
    ("digits.c32.16.s1", 32, 16, 3, 1),
    ("digits.c32.16.s2", 32, 16, 3, 2),
    ("digits.c64.8.s1", 64, 8, 3, 1),
    ("digits.c64.8.s2", 64, 8, 3, 2),
    ("digits.c128.4.s1", 128, 4, 3, 1),
]
QUICK = ["mbv2.c32.112.s1", "mbv2.c96.112.s2", "mbv2.c384.14.s1", "cnxa.c40.56.k7"]
PASSES = ("fwd", "dgrad", "wgrad", "full")


def _eager_backward(
    x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, stride: int, pad: int, mask: list[bool]
):
    return torch.ops.aten.convolution_backward(
        g, x, w, [w.shape[0]], [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], w.shape[0], mask
    )


def _providers(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, g: torch.Tensor, stride: int, pad: int
) -> dict[str, dict[str, Callable[[], object]]]:
    """pass -> provider -> a no-argument callable running that pass."""
    c = w.shape[0]
    xg, wg, bg = (t.detach().clone().requires_grad_(True) for t in (x, w, b))

    def eager_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, w, b, stride, pad, 1, c)

    def ours_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fastops.depthwise_conv2d(x, w, b, stride, pad, 1)

    def full(fn: Callable) -> Callable[[], object]:
        return lambda: torch.autograd.grad(fn(xg, wg, bg), (xg, wg, bg), g)

    cl = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    args4 = ([stride] * 2, [pad] * 4, [1, 1])
    out: dict[str, dict[str, Callable[[], object]]] = {
        "fwd": {
            "fastops": lambda: ours_fwd(x, w, b),
            "eager": lambda: eager_fwd(x, w, b),
        },
        "dgrad": {
            "fastops": lambda: torch.ops.fastops.depthwise_conv2d_backward_input(
                g, w, list(x.shape), *args4, cl
            ),
            "eager": lambda: _eager_backward(x, w, g, stride, pad, [True, False, False]),
        },
        "wgrad": {
            "fastops": lambda: torch.ops.fastops.depthwise_conv2d_backward_weight(
                g, x, list(w.shape[2:]), *args4
            ),
            "eager": lambda: _eager_backward(x, w, g, stride, pad, [False, True, True]),
        },
        "full": {"fastops": full(ours_fwd), "eager": full(eager_fwd)},
    }
    compiled = common.compiled(eager_fwd)
    out["fwd"]["compile"] = lambda: compiled(x, w, b)
    out["full"]["compile"] = full(compiled)
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summary(args: argparse.Namespace, results: list[common.Result]) -> str:
    """Geomean speedup of fastops over eager (same layout), eager NCHW, eager channels_last and
    compile, per (dtype, layout, pass)."""
    times: dict[tuple[str, str, str, str], dict[str, float]] = {}
    for r in results:
        layout, shape = str(r.extra["layout"]), str(r.extra["shape"])
        times.setdefault((r.dtype, r.direction, shape, layout), {})[r.provider] = r.median_ms
    lines = [
        "| dtype | layout | pass | vs eager (same layout) | vs eager NCHW | vs eager channels_last | vs compile | shapes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(d, lay, p) for (d, p, _, lay) in times}, key=lambda k: (k[0], k[1], PASSES.index(k[2])))
    for dtype, layout, p in keys:
        cols: dict[str, list[float]] = {"same": [], "nchw": [], "cl": [], "compile": []}
        cases = sorted({case for (d, pp, case, lay) in times if (d, pp, lay) == (dtype, p, layout)})
        for case in cases:
            mine = times[(dtype, p, case, layout)]
            ours = mine.get("fastops")
            if not ours:
                continue
            nchw = times.get((dtype, p, case, "nchw"), {}).get("eager")
            cl = times.get((dtype, p, case, "channels_last"), {}).get("eager")
            for key, other in (
                ("same", mine.get("eager")),
                ("nchw", nchw),
                ("cl", cl),
                ("compile", mine.get("compile")),
            ):
                if other:
                    cols[key].append(other / ours)

        def fmt(v: list[float]) -> str:
            return f"{_geomean(v):.2f}x" if v else "-"

        lines.append(
            f"| {dtype} | {layout} | {p} | {fmt(cols['same'])} | {fmt(cols['nchw'])} | {fmt(cols['cl'])} | "
            f"{fmt(cols['compile'])} | {len(cases)} |"
        )
    return "\n".join(lines)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default 32 CPU, 256 CUDA)")
    parser.add_argument("--shapes", default="", help="comma-separated case names (default: all)")
    parser.add_argument(
        "--layouts", default="nchw,channels_last", help="comma-separated layouts (nchw, channels_last)"
    )


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    device = args.device
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
    batch = args.batch or (32 if device == "cpu" else 256)
    if not set(args.layouts.split(",")) <= {"nchw", "channels_last"}:
        raise SystemExit(f"--layouts: expected nchw and/or channels_last, got {args.layouts!r}")
    shapes = common.select_shapes(MOBILENET_V2 + CONVNEXT_ATTO, args.shapes, QUICK if args.quick else None)
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for name, c, h, k, stride in shapes:
            pad = k // 2
            oh = (h + 2 * pad - k) // stride + 1
            flops = 2 * batch * c * oh * oh * k * k
            item = torch.empty((), dtype=dtype).element_size()
            x_bytes, y_bytes = batch * c * h * h * item, batch * c * oh * oh * item
            nbytes = {"fwd": x_bytes + y_bytes, "dgrad": y_bytes + x_bytes, "wgrad": x_bytes + y_bytes}
            nbytes["full"] = 3 * (x_bytes + y_bytes)
            pass_flops = {"fwd": flops, "dgrad": flops, "wgrad": flops, "full": 3 * flops}
            base_x = torch.randn(batch, c, h, h, device=device, dtype=dtype)
            base_g = torch.randn(batch, c, oh, oh, device=device, dtype=dtype)
            w = torch.randn(c, 1, k, k, device=device, dtype=dtype)
            b = torch.randn(c, device=device, dtype=dtype)
            for layout in args.layouts.split(","):
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                x, g = base_x.contiguous(memory_format=fmt), base_g.contiguous(memory_format=fmt)
                providers = _providers(x, w, b, g, stride, pad)
                for p in PASSES:
                    yield common.BenchCase(
                        f"{name} {layout}",
                        p,
                        dtype,
                        f"{batch}x{c}x{h}x{h} k{k} s{stride}",
                        providers[p],
                        nbytes=nbytes[p],
                        flops=pass_flops[p],
                        grad=p == "full",
                        extra={"layout": layout, "shape": name},
                    )
                del x, g, providers
            del base_x, base_g


def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
    return (
        "Geomean speedup of fastops (higher is better; fastops runs in the layout of the row):\n\n"
        + summary(args, results)
        + "\n\nThe CPU is shared with other jobs (2 cores, other builds running), so times are noisy: "
        "medians with p20/p80 are reported. TFLOP/s is in the CSV (column tflops). "
        "Eager dgrad/wgrad = aten.convolution_backward with output_mask for that gradient only."
        + common.allocation_note(args)
    )


def main() -> None:
    common.run_benchmark(
        "depthwise_conv2d",
        cases,
        description=__doc__.splitlines()[0],
        options=options,
        notes=notes,
        summary=summary,
        # Many shapes x layouts x passes x providers: 0.3 s of repetitions per case (at least 5 after
        # 3 warm-ups) keeps the default run near 10 minutes on 2 cores, compile warm-ups included.
        min_time=0.3,
        quick_min_time=0.2,
    )


if __name__ == "__main__":
    main()
