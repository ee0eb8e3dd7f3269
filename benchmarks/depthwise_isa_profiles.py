"""Eager vs fastops depthwise conv at MobileNetV2 3x3 layer shapes (batch 32) under a CPU ISA profile.

Checks the issue's claims about eager CPU depthwise (NCHW fp32 much slower than channels_last; bf16
falling to a slow path on CPUs without AVX-512) on the machine at hand. Run it once as is and once
with an AVX2 profile, e.g.

    python benchmarks/depthwise_isa_profiles.py
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 FASTOPS_CPU_CAPABILITY=avx2 \
        python benchmarks/depthwise_isa_profiles.py

(ATEN_CPU_CAPABILITY alone does not change eager conv: oneDNN dispatches on its own, so
ONEDNN_MAX_CPU_ISA is what emulates a CPU without AVX-512.) Medians of 5 after one warm-up, ms,
freed blocks reused (benchmarks.common.fair_cpu_allocation).
"""

# ruff: noqa: B023  (each lambda is timed at once, inside its loop iteration)
from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import fastops
from benchmarks import common

SHAPES = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (192, 28, 1), (384, 14, 1), (960, 7, 1)]


def median_ms(fn: Callable[[], object], reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    common.fair_cpu_allocation()
    print(
        f"ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', '(unset)')} "
        f"ONEDNN_MAX_CPU_ISA={os.environ.get('ONEDNN_MAX_CPU_ISA', '(unset)')} "
        f"torch capability {torch.backends.cpu.get_cpu_capability()}, threads {torch.get_num_threads()}"
    )
    for dtype in (torch.float32, torch.bfloat16):
        totals: dict[tuple[str, str], float] = {}
        for layout in ("NCHW", "CL"):
            for c, h, s in SHAPES:
                x = torch.randn(32, c, h, h, dtype=dtype)
                if layout == "CL":
                    x = x.contiguous(memory_format=torch.channels_last)
                w, b = torch.randn(c, 1, 3, 3, dtype=dtype), torch.randn(c, dtype=dtype)
                xg, wg, bg = (t.clone().requires_grad_(True) for t in (x, w, b))
                g = torch.randn_like(F.conv2d(x, w, b, s, 1, 1, c))
                with torch.no_grad():
                    eager = median_ms(lambda: F.conv2d(x, w, b, s, 1, 1, c))
                    ours = median_ms(lambda: fastops.depthwise_conv2d(x, w, b, s, 1, 1))
                eager_full = median_ms(
                    lambda: torch.autograd.grad(F.conv2d(xg, wg, bg, s, 1, 1, c), (xg, wg, bg), g)
                )
                ours_full = median_ms(
                    lambda: torch.autograd.grad(
                        fastops.depthwise_conv2d(xg, wg, bg, s, 1, 1), (xg, wg, bg), g
                    )
                )
                for key, value in (("e", eager), ("o", ours), ("ef", eager_full), ("of", ours_full)):
                    totals[(layout, key)] = totals.get((layout, key), 0.0) + value
                print(
                    f"{str(dtype)[6:]:8s} {layout:4s} C{c} H{h} s{s}: fwd eager {eager:8.2f} fastops {ours:8.2f} | "
                    f"full eager {eager_full:8.2f} fastops {ours_full:8.2f}",
                    flush=True,
                )
        for layout in ("NCHW", "CL"):
            e, o, ef, of = (totals[(layout, k)] for k in ("e", "o", "ef", "of"))
            print(
                f"TOTAL {str(dtype)[6:]} {layout}: fwd eager {e:.1f} fastops {o:.1f} ({e / o:.2f}x) | "
                f"full eager {ef:.1f} fastops {of:.1f} ({ef / of:.2f}x)",
                flush=True,
            )


if __name__ == "__main__":
    main()
