"""The CUDA kernels whose GPU numbers miss their targets, each run once (ours, then eager's kernel for the
same work) between cudaProfilerStart and cudaProfilerStop, for Nsight Compute:

    ncu --profile-from-start off --section SpeedOfLight ... python -m benchmarks.profile_cuda_kernels

(`.ci/gpu/run.sh profile` runs it so and keeps ncu's per-kernel table). Every target is warmed up (and
cuDNN's algorithm chosen) before the profiled region, so ncu sees the steady-state kernels only.
Targets: `--targets` names a subset of TARGETS (default: all).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

import fastops

Target = Callable[[], object]


def _depthwise(dtype: torch.dtype, k: int, c: int, side: int) -> dict[str, Target]:
    torch.backends.cudnn.benchmark = True
    n, pad = 256, k // 2
    cl = torch.channels_last
    x = torch.randn(n, c, side, side, device="cuda", dtype=dtype).contiguous(memory_format=cl)
    g = torch.randn(n, c, side, side, device="cuda", dtype=dtype).contiguous(memory_format=cl)
    w = torch.randn(c, 1, k, k, device="cuda", dtype=dtype)
    return {
        "ours": lambda: torch.ops.fastops.depthwise_conv2d_backward_weight(
            g, x, [k, k], [1, 1], [pad] * 4, [1, 1]
        ),
        "eager": lambda: torch.ops.aten.convolution_backward(
            g, x, w, [c], [1, 1], [pad, pad], [1, 1], False, [0, 0], c, [False, True, True]
        ),
    }


def _gelu_backward(dtype: torch.dtype) -> dict[str, Target]:
    x = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    return {
        "ours": lambda: torch.ops.fastops.gelu_backward(g, x, "none"),
        "eager": lambda: torch.ops.aten.gelu_backward(g, x, approximate="none"),
    }


def _gelu_forward(dtype: torch.dtype) -> dict[str, Target]:
    x = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    return {"ours": lambda: fastops.gelu(x), "eager": lambda: F.gelu(x)}


def _bias_gelu_backward(dtype: torch.dtype) -> dict[str, Target]:
    x = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    b = torch.randn(4096, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    return {
        "ours": lambda: torch.ops.fastops.bias_gelu_backward(g, x, b, "none"),
        "eager": lambda: torch.ops.aten.gelu_backward(g, x + b, approximate="none").sum(0),
    }


def _clipped_log() -> dict[str, Target]:
    x = torch.rand(1 << 24, device="cuda") - 0.1
    return {"ours": lambda: fastops.clipped_log(x), "eager": lambda: torch.log(torch.clamp(x, min=1e-6))}


def _se_scale(channels_last: bool) -> dict[str, Target]:
    x = torch.randn(64, 144, 56, 56, device="cuda")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    s = torch.rand(64, 144, device="cuda")
    return {
        "ours": lambda: torch.ops.fastops.squeeze_excite_scale(x, s),
        "eager": lambda: x * s[:, :, None, None],
    }


TARGETS: dict[str, Callable[[], dict[str, Target]]] = {
    "depthwise_wgrad_cl_fp32_k3": lambda: _depthwise(torch.float32, 3, 32, 112),
    "depthwise_wgrad_cl_bf16_k3": lambda: _depthwise(torch.bfloat16, 3, 32, 112),
    "depthwise_wgrad_cl_bf16_k7": lambda: _depthwise(torch.bfloat16, 7, 40, 56),
    "gelu_bwd_bf16": lambda: _gelu_backward(torch.bfloat16),
    "gelu_fwd_fp32": lambda: _gelu_forward(torch.float32),
    "bias_gelu_bwd_bf16": lambda: _bias_gelu_backward(torch.bfloat16),
    "clipped_log_fwd_fp32": _clipped_log,
    "se_scale_nchw_fp32": lambda: _se_scale(False),
    "se_scale_cl_fp32": lambda: _se_scale(True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated names of TARGETS")
    args = parser.parse_args()
    names = [n for n in args.targets.split(",") if n]
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        raise SystemExit(f"profile_cuda_kernels: unknown targets {unknown}; expected some of {list(TARGETS)}")
    if not torch.cuda.is_available():
        raise SystemExit("profile_cuda_kernels: needs a CUDA device")
    runs = []
    for name in names:
        providers = TARGETS[name]()
        for provider, fn in providers.items():
            for _ in range(3):  # warm-up: allocator, cuDNN's algorithm search, lazy module loading
                fn()
            runs.append((name, provider, fn))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, provider, fn in runs:
        with torch.cuda.nvtx.range(f"{name}:{provider}"):
            fn()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    for name, provider, _ in runs:
        print(f"profiled {name}:{provider}")


if __name__ == "__main__":
    main()
