"""clipped_log: fastops vs eager torch.log(torch.clamp(x, eps)) vs torch.compile of it.

Bytes counted (minimal traffic): forward reads x and writes y (2 * itemsize per element); forward +
backward also reads g and x and writes dx (5 * itemsize). Eager runs clamp, log, and their two
backward kernels, so it moves about twice that; compile fuses them like we do.

    python benchmarks/bench_clipped_log.py [--device cpu|cuda] [--quick]
"""

from __future__ import annotations

import torch

import fastops
from benchmarks import common

EPS = 1e-6


def eager(x: torch.Tensor) -> torch.Tensor:
    return torch.log(torch.clamp(x, min=EPS))


def ours(x: torch.Tensor) -> torch.Tensor:
    # exact mode: the same gradient contract as the eager expression
    return fastops.clipped_log(x, EPS, straight_through=False)


def main() -> None:
    args = common.base_parser(__doc__.splitlines()[0]).parse_args()
    device = args.device
    if device == "cpu" and not args.fresh_pages:
        common.fair_cpu_allocation()
    sizes = [1 << 16, 1 << 20, 1 << 24] if args.quick else [1 << 16, 1 << 20, 1 << 24, 1 << 26]
    if device == "cuda" and not args.quick:
        sizes.append(1 << 28)  # 256M: launch and tail costs amortized, the roofline regime
    dtypes = [torch.float32, torch.bfloat16]
    min_time = 0.3 if args.quick else args.min_time
    roofline = common.copy_roofline_gbps(device, min_time=min_time)
    print(f"copy roofline on {device}: {roofline:.1f} GB/s", flush=True)

    results: list[common.Result] = []
    for dtype in dtypes:
        for n in sizes:
            x = (torch.rand(n, device=device, dtype=torch.float32) * 4 - 1).to(dtype)
            g = torch.randn(n, device=device, dtype=dtype)
            providers = {"fastops": ours, "eager": eager}
            compiled = common.maybe_compile(eager, not args.no_compile)
            if compiled is not None:
                providers["compile"] = compiled
            size = common.human_size(n)
            item = x.element_size()
            for name, fn in providers.items():
                with torch.no_grad():
                    results.append(
                        common.measure(
                            "clipped_log",
                            "1-D",
                            "fwd",
                            dtype,
                            size,
                            name,
                            lambda fn=fn, x=x: fn(x),
                            device,
                            2 * n * item,
                            roofline,
                            min_time,
                        )
                    )
                xg = x.detach().clone().requires_grad_(True)

                def fwd_bwd(fn=fn, xg=xg, g=g) -> torch.Tensor:
                    return torch.autograd.grad(fn(xg), xg, g)[0]

                results.append(
                    common.measure(
                        "clipped_log",
                        "1-D",
                        "fwd+bwd",
                        dtype,
                        size,
                        name,
                        fwd_bwd,
                        device,
                        5 * n * item,
                        roofline,
                        min_time,
                    )
                )
                r = results[-1]
                print(
                    f"{dtype} {size:>4} {name:8s} fwd {results[-2].median_ms:9.4f} ms  "
                    f"fwd+bwd {r.median_ms:9.4f} ms ({r.gbps:6.1f} GB/s)",
                    flush=True,
                )
            del x, g

    notes = (
        "fastops runs with straight_through=False (the eager expression's own gradient). "
        "Bytes: fwd 2 x itemsize / element, fwd+bwd 5 x itemsize / element."
    )
    if device == "cpu":
        notes += " CPU allocations: " + (
            "fresh pages (glibc default)" if args.fresh_pages else "glibc mmap disabled, freed blocks reused"
        )
    table = common.format_table(results, roofline)
    csv_path, md_path = common.write_results(
        "clipped_log", device, results, roofline, args.out, args.tag, notes
    )
    print(table)
    print(f"wrote {csv_path} and {md_path}")


if __name__ == "__main__":
    main()
