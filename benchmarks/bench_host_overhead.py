"""Per-call host cost: fastops vs eager on tensors of a few elements, where the kernels do ~nothing.

What a call costs before its kernel does any work: the Python wrapper, the dispatcher, the autograd
layer and the launch. Below ~16M elements a GPU op's time is mostly this (the H200 run of 2026-11-27:
fwd+bwd 0.19-0.26 ms for any size up to 16M against eager's 0.11-0.15), and on the CPU it is what
small layers pay. Cases: gelu, bias_gelu, clipped_log and depthwise_conv2d (3x3) on 8-element (4x4x8
for depthwise) inputs; forward without grad, and forward + ``torch.autograd.grad``. Providers:

* ``fastops``: the public function (``fastops.gelu``: argument checks, then the op);
* ``torch.ops``: the registered op called directly (``torch.ops.fastops.gelu``);
* ``module``: the ``fastops.nn`` module under ``backend="auto"`` with its kernel choice made (tuned
  before timing), which is what a swapped model pays per layer;
* ``nn.Module(torch.ops)``: a bare ``nn.Module`` whose forward only calls the registered op, the
  floor of any module (the module call itself); ``module`` minus this is the cost of the kernel
  choice and of the module's own argument handling;
* ``eager``: the expression each op replaces.

Bandwidth means nothing here (0 bytes counted).

    python -m benchmarks.bench_host_overhead [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

import fastops
from benchmarks import common
from fastops import policy

EPS = 1e-6


def _fwd_bwd(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> Callable[[], object]:
    leaves = tuple(t.detach().clone().requires_grad_(True) for t in inputs)
    g = torch.ones_like(fn(*leaves))
    return lambda: torch.autograd.grad(fn(*leaves), leaves, g, allow_unused=True)


class _Bare(torch.nn.Module):
    """The floor of a module's call: nn.Module.__call__ around the registered op, nothing else."""

    def __init__(self, op: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.op = op

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.op(*inputs)


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    import os

    os.environ.pop(policy.BACKEND_ENV, None)  # the module rows: the choice as users get it
    device = args.device
    x = torch.rand(1, 8, device=device) + 0.5
    b = torch.randn(8, device=device)
    xc = torch.rand(1, 8, 4, 4, device=device)
    w = torch.randn(8, 1, 3, 3, device=device)
    gelu = fastops.nn.GELU()
    bias_gelu = fastops.nn.BiasGELU(8, device=device)
    clipped_log = fastops.nn.ClippedLog(EPS, straight_through=False)
    depthwise = fastops.nn.DepthwiseConv2d(8, 3, padding=1, bias=False, device=device)
    with torch.no_grad():
        bias_gelu.bias.copy_(b)
        depthwise.weight.copy_(w)
    ops: dict[
        str,
        tuple[
            tuple[torch.Tensor, ...],
            Callable[..., torch.Tensor],
            Callable[..., torch.Tensor],
            Callable[..., torch.Tensor],
            Callable[..., torch.Tensor],
        ],
    ] = {
        "gelu": ((x,), fastops.gelu, lambda t: torch.ops.fastops.gelu(t, "none"), gelu, F.gelu),
        "bias_gelu": (
            (x, b),
            fastops.bias_gelu,
            lambda t, bias: torch.ops.fastops.bias_gelu(t, bias, "none"),
            lambda t, bias: bias_gelu(t),
            lambda t, bias: F.gelu(t + bias),
        ),
        "clipped_log": (
            (x,),
            lambda t: fastops.clipped_log(t, EPS, straight_through=False),
            lambda t: torch.ops.fastops.clipped_log(t, EPS, False),
            clipped_log,
            lambda t: torch.log(torch.clamp(t, min=EPS)),
        ),
        "depthwise_conv2d": (
            (xc, w),
            lambda t, weight: fastops.depthwise_conv2d(t, weight, None, 1, 1),
            lambda t, weight: torch.ops.fastops.depthwise_conv2d(
                t, weight, None, [1, 1], [1, 1, 1, 1], [1, 1]
            ),
            lambda t, weight: depthwise(t),
            lambda t, weight: F.conv2d(t, weight, None, 1, 1, groups=t.shape[1]),
        ),
    }
    for name, (inputs, ours, raw, module, eager) in ops.items():
        size = "x".join(str(s) for s in inputs[0].shape)
        providers = {
            "fastops": ours,
            "torch.ops": raw,
            "module": module,
            "nn.Module(torch.ops)": _Bare(raw),
            "eager": eager,
        }
        with torch.no_grad():
            module(*inputs)  # the module's kernel choice for inference, made before timing
        fwd = {k: lambda f=f, a=inputs: f(*a) for k, f in providers.items()}
        yield common.BenchCase(name, "fwd", torch.float32, size, fwd, grad=False)
        both = {k: _fwd_bwd(f, inputs) for k, f in providers.items()}
        yield common.BenchCase(name, "fwd+bwd", torch.float32, size, both)


def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
    return (
        "Host cost per call: inputs of a few elements, so the kernels do almost no work. fwd runs "
        "under no_grad; fwd+bwd records the graph and runs torch.autograd.grad. No torch.compile "
        "provider: a compiled graph's own call overhead is another question. module: the fastops.nn "
        "module with its kernel choice already made (the module rows may run PyTorch's kernel where "
        "it measured faster)."
    )


def main() -> None:
    common.run_benchmark(
        "host_overhead", cases, description=__doc__.splitlines()[0], notes=notes, min_time=0.5
    )


if __name__ == "__main__":
    main()
