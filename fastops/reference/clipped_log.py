"""Plain-PyTorch clipped_log: the definition every test and benchmark compares against."""

from __future__ import annotations

import torch
from torch import Tensor


class _StraightThroughClippedLog(torch.autograd.Function):
    generate_vmap_rule = True  # for torch.func.vmap: forward and backward are plain PyTorch

    @staticmethod
    def forward(x: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        return torch.log(torch.clamp(x, min=eps))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, eps = inputs
        ctx.save_for_backward(x)
        ctx.eps = eps

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (x,) = ctx.saved_tensors
        return grad_out / torch.clamp(x, min=ctx.eps), None


def clipped_log(x: Tensor, eps: float = 1e-6, straight_through: bool = True) -> Tensor:
    """``log(clamp(x, min=eps))``; gradient ``g / clamp(x, eps)`` everywhere when straight_through,
    else torch's own autograd of the expression (zero strictly below eps)."""
    if straight_through:
        return _StraightThroughClippedLog.apply(x, eps)
    return torch.log(torch.clamp(x, min=eps))
