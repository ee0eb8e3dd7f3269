"""Plain-PyTorch squeeze-excitation: the definition every test and benchmark compares against."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "silu": F.silu, "gelu": F.gelu}


def _hardsigmoid(z: Tensor) -> Tensor:
    # relu6(z + 3) / 6 is F.hardsigmoid (gradient 1/6 strictly inside (-3, 3)); aten's own float64
    # hardsigmoid backward multiplies by a float32 1/6, 3e-8 off, too coarse for a float64 reference.
    return F.relu6(z + 3) / 6


GATES: dict[str, Callable[[Tensor], Tensor]] = {"sigmoid": torch.sigmoid, "hardsigmoid": _hardsigmoid}


def squeeze_excite(
    x: Tensor,
    fc1_weight: Tensor,
    fc1_bias: Tensor | None,
    fc2_weight: Tensor,
    fc2_bias: Tensor | None,
    act: str = "relu",
    gate: str = "sigmoid",
) -> Tensor:
    """``x * gate(fc2(act(fc1(x.mean((2, 3))))))[:, :, None, None]`` for x of shape (N, C, H, W),
    fc1 (R, C) and fc2 (C, R) Linear weights; ``gelu`` is the erf form."""
    if act not in ACTIVATIONS or gate not in GATES:
        raise ValueError(f"act must be one of {list(ACTIVATIONS)} and gate one of {list(GATES)}")
    pooled = x.mean((2, 3))
    hidden = ACTIVATIONS[act](F.linear(pooled, fc1_weight, fc1_bias))
    scale = GATES[gate](F.linear(hidden, fc2_weight, fc2_bias))
    return x * scale[:, :, None, None]
