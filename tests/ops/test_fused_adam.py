"""fastops.ops.fused_adam (the functional form of torch.ops.fastops.fused_adam_) through the contract
kit: the tensors it updates in place against the float64 reference step, and opcheck. The optimizer
classes built on it are tested in tests/optim/test_fused_adam.py."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from fastops import reference
from fastops.ops.fused_adam import fused_adam
from tests.ops.contract import ContractTests, OpSpec, Sample

# Odd sizes, a 0-d param, an empty one, and one spanning several CUDA chunks (16384 elements).
SHAPES = [(7, 5), (), (300, 257), (3, 0, 2), (33,)]


def adam_samples(device: str, dtype: torch.dtype, requires_grad: bool) -> Iterator[Sample]:
    gen = torch.Generator().manual_seed(0)
    for amsgrad in (False, True):
        for decoupled in (False, True):
            params = [
                torch.randn(s, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)
                for s in SHAPES
            ]
            lists = [
                params,
                [torch.randn_like(p) for p in params],
                [torch.randn_like(p) * 0.1 for p in params],
                [torch.rand_like(p) * 0.1 for p in params],
                [torch.rand_like(p) * 0.2 for p in params] if amsgrad else [],
                [torch.full((), 3.0, device=device) for _ in params],
            ]
            hyper = {
                "lr": 1e-2,
                "beta1": 0.9,
                "beta2": 0.999,
                "weight_decay": 0.01,
                "eps": 1e-8,
                "amsgrad": amsgrad,
                "maximize": False,
                "decoupled_weight_decay": decoupled,
            }
            yield Sample(tuple(lists), hyper, id=f"amsgrad={amsgrad}-decoupled={decoupled}")


def adam_opcheck(device: str, dtype: torch.dtype) -> Iterator[tuple]:
    for s in adam_samples(device, dtype, False):
        keep = [i for i, p in enumerate(s.args[0]) if p.numel()]
        lists = [[lst[i] for i in keep] if lst else [] for lst in s.args]
        scalars = {
            "grad_scale": torch.tensor(2.0, device=device),
            "found_inf": torch.tensor(0.0, device=device),
        }
        yield torch.ops.fastops.fused_adam_.default, (*lists, None, *s.kwargs.values()), scalars


FUSED_ADAM = OpSpec(
    name="fused_adam_",
    op=fused_adam,
    reference=reference.adam_step,
    sample_inputs=adam_samples,
    opcheck_inputs=adam_opcheck,
    opcheck_utils=("test_schema", "test_faketensor"),
    dtypes=(torch.float32, torch.float16, torch.bfloat16),
    mutates=True,
    differentiable=False,
    checks=("reference", "opcheck"),
)


class TestFusedAdamContract(ContractTests):
    spec = FUSED_ADAM
