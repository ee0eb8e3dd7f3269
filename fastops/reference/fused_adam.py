"""Plain-PyTorch Adam / AdamW step over lists of tensors: what fastops.optim's kernel computes.

Same arguments as ``fastops.ops.fused_adam.fused_adam`` and the same contract (steps incremented
here, grads written back unscaled when ``grad_scale`` is given, nothing touched when ``found_inf``
is nonzero), one tensor at a time with the operations of ``torch.optim.Adam(foreach=False)``. It
reads found_inf on the host, which the kernels never do.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.no_grad()
def adam_step(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    max_exp_avg_sqs: list[Tensor],
    state_steps: list[Tensor],
    *,
    lr: float | Tensor,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    amsgrad: bool,
    maximize: bool,
    decoupled_weight_decay: bool,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
) -> None:
    if found_inf is not None and float(found_inf) != 0.0:
        return
    lr = float(lr)
    for i, param in enumerate(params):
        grad = grads[i]
        if grad_scale is not None:
            grad.div_(grad_scale.to(grad.device))
        if maximize:
            grad = -grad
        exp_avg, exp_avg_sq = exp_avgs[i], exp_avg_sqs[i]
        state_steps[i] += 1
        step = float(state_steps[i])
        if weight_decay != 0:
            if decoupled_weight_decay:
                param.mul_(1 - lr * weight_decay)
            else:
                grad = grad.add(param, alpha=weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        second = exp_avg_sq
        if amsgrad:
            torch.maximum(max_exp_avg_sqs[i], exp_avg_sq, out=max_exp_avg_sqs[i])
            second = max_exp_avg_sqs[i]
        denom = (second.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)
