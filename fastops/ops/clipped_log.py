"""clipped_log: log(clamp(x, min=eps)) with a choice of gradient, as one fused kernel each way."""

from __future__ import annotations

import torch
from torch import Tensor

from fastops import reference
from fastops.ops._validate import check_real, check_tensor, under_torch_func


def clipped_log(x: Tensor, eps: float = 1e-6, straight_through: bool = True) -> Tensor:
    """``log(clamp(x, min=eps))`` in one pass, forward and backward.

    Args:
        x: float32, float16 or bfloat16 tensor (float64 on the CPU) of any shape and layout, on the
            CPU or a CUDA device. The output has x's dtype, shape and (for dense x) strides.
        eps: the clamp floor, a finite float > 0. For fp16/bf16 inputs it is held in fp32 and the
            math runs in fp32, so ``eps=1e-8`` gives ``log(1e-8) = -18.42`` where the eager fp16
            expression gives ``-inf`` (1e-8 rounds to 0 in fp16).
        straight_through: the gradient. ``True`` (default): ``grad / clamp(x, eps)`` everywhere,
            also below eps (the LogClipFunction definition: small inputs keep a gradient).
            ``False``: exactly the autograd of ``torch.log(torch.clamp(x, min=eps))`` — zero
            strictly below eps, ``grad / eps`` at ``x == eps``, zero where x is NaN.

    NaN propagates (``clipped_log(nan) = nan``), ``+inf -> +inf``, ``-inf -> log(eps)``.
    Under autocast it runs in float32, as ``torch.log`` does.

    Equals: ``torch.log(torch.clamp(x, min=eps))`` (see ``fastops.reference.clipped_log``).
    """
    # The op checks x and eps's range against x's compute type (csrc/cpu/clipped_log.cpp).
    check_tensor("clipped_log", "x", x)
    eps = check_real("clipped_log", "eps", eps)
    if under_torch_func():
        return reference.clipped_log(x, eps, bool(straight_through))
    return torch.ops.fastops.clipped_log.default(x, eps, bool(straight_through))


# Shape inference needs nothing of the arguments (the output is shaped as x); the checks are the
# kernels', which a compiled graph runs too, so it raises what an eager call raises.
@torch.library.register_fake("fastops::clipped_log")
def _clipped_log_fake(x: Tensor, eps: float, straight_through: bool) -> Tensor:
    return torch.empty_like(x)


@torch.library.register_fake("fastops::clipped_log_backward")
def _clipped_log_backward_fake(grad_out: Tensor, x: Tensor, eps: float, straight_through: bool) -> Tensor:
    torch._check(
        grad_out.shape == x.shape,
        lambda: f"fastops.clipped_log_backward: expected grad_out to have the shape of x {tuple(x.shape)}",
    )
    return torch.empty_like(x)


# Autograd is C++ (csrc/clipped_log_op.cpp): the op's first derivative and the backward op's own
# (double backward); so is the autocast rule (float32, as torch.log).
