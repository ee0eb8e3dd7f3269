"""Plain-PyTorch gelu and bias_gelu: the definitions every test and benchmark compares against.

Both are torch.nn.functional.gelu, written in a form that keeps its relative accuracy in the
negative tail (run them in float64 for a reference): the erf form as 0.5 * x * erfc(-x / sqrt(2))
(the textbook 0.5 * x * (1 + erf(x / sqrt(2))) rounds to 0 below x ~ -8.3 even in float64), the tanh
form as x * sigmoid(2 * y), which equals 0.5 * x * (1 + tanh(y)) with y = sqrt(2/pi) * (x + 0.044715 x^3).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_TANH_C = 0.044715


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """``torch.nn.functional.gelu(x, approximate=approximate)``, accurate in the negative tail."""
    if approximate == "none":
        return 0.5 * x * torch.special.erfc(-x * math.sqrt(0.5))
    if approximate == "tanh":
        return x * torch.sigmoid(2.0 * _SQRT_2_OVER_PI * (x + _TANH_C * x * x * x))
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """``gelu(x + bias)`` with ``bias`` broadcast over the last dimension of ``x``."""
    return gelu(x + bias, approximate)
