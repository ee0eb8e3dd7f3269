"""gelu and bias_gelu: GELU (erf or tanh form), optionally after a bias add, as one fused kernel each way."""

from __future__ import annotations

import torch
from torch import Tensor

from fastops import reference
from fastops.ops._validate import check_approximate, check_same_device, check_tensor, under_torch_func


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU in one pass each way; same contract as ``torch.nn.functional.gelu``.

    Args:
        x: float32, float16 or bfloat16 tensor (float64 on the CPU) of any shape and layout, on the
            CPU or a CUDA device. The output has x's dtype, shape and (for dense x) strides; the math
            runs in float32 for fp16/bf16.
        approximate: ``"none"``: ``x * Phi(x)`` with the exact normal CDF (erf form); ``"tanh"``:
            ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``. Anything else raises.

    Accuracy: the erf form is evaluated through ``0.5 * erfc(|x| / sqrt(2))``, so it keeps a few-ulp
    relative accuracy in the negative tail, where eager's ``0.5 * x * (1 + erf(x / sqrt(2)))`` has
    up to 100% relative error in fp32 (it rounds to 0 below x ~ -5.4). The tanh form is evaluated as
    ``x * sigmoid(2y)``, with the same property. Special values: ``gelu(-inf) = nan``,
    ``gelu(+inf) = +inf``, ``nan -> nan`` (eager CPU fp32 returns nan for ``+inf`` in the erf form).

    Gradient: ``grad * (Phi(x) + x * phi(x))`` (erf) or the derivative of the tanh expression, from a
    fused backward kernel that recomputes from x (only x is saved). Twice differentiable.
    Under autocast it runs in the dtype it receives, as ``aten::gelu`` does.

    Equals: ``torch.nn.functional.gelu(x, approximate=approximate)`` (see ``fastops.reference.gelu``).
    """
    # The op checks x and the value of approximate (csrc/cpu/gelu.cpp); here only what its schema cannot take.
    check_tensor("gelu", "x", x)
    if type(approximate) is not str:
        check_approximate("gelu", approximate)
    if under_torch_func():
        return reference.gelu(x, approximate)
    return torch.ops.fastops.gelu.default(x, approximate)


def bias_gelu(x: Tensor, bias: Tensor, approximate: str = "none") -> Tensor:
    """``gelu(x + bias)`` in one pass each way, bias broadcast over the last dimension.

    Args:
        x: tensor of shape ``(..., N)`` (at least 1-D), dtypes and devices as :func:`gelu`. A
            non-contiguous x is made contiguous first; the output is contiguous.
        bias: 1-D tensor of N elements with x's dtype and device.
        approximate: ``"none"`` or ``"tanh"`` as in :func:`gelu`.

    The sum ``x + bias`` is formed in float32 registers and never written to memory, also for
    fp16/bf16 (eager rounds it to the input dtype first). The backward kernel recomputes it from x
    and bias (only those are saved) and returns ``grad_x = grad * gelu'(x + bias)`` and
    ``grad_bias = grad_x.sum(all leading dims)``, reduced inside our kernels in float32 with a fixed
    summation order (bitwise deterministic from run to run and for any thread count). Twice
    differentiable.

    Equals: ``torch.nn.functional.gelu(x + bias, approximate=approximate)`` (see
    ``fastops.reference.bias_gelu``).
    """
    check_tensor("bias_gelu", "x", x)
    check_tensor("bias_gelu", "bias", bias)
    if type(approximate) is not str:
        check_approximate("bias_gelu", approximate)
    if under_torch_func():
        return reference.bias_gelu(x, bias, approximate)
    return torch.ops.fastops.bias_gelu.default(x, bias, approximate)


# ---- fake kernels -------------------------------------------------------------------------------
# Shape inference needs nothing of the arguments here (the outputs are shaped as x and bias) but one
# device for them; the other checks are the kernels', which a compiled graph runs too, so it raises
# what an eager call raises.


@torch.library.register_fake("fastops::gelu")
def _gelu_fake(x: Tensor, approximate: str) -> Tensor:
    return torch.empty_like(x)


@torch.library.register_fake("fastops::gelu_backward")
def _gelu_backward_fake(grad_out: Tensor, x: Tensor, approximate: str) -> Tensor:
    torch._check(
        grad_out.shape == x.shape,
        lambda: f"fastops.gelu_backward: expected grad_out to have the shape of x {tuple(x.shape)}",
    )
    return torch.empty_like(x)


@torch.library.register_fake("fastops::bias_gelu")
def _bias_gelu_fake(x: Tensor, bias: Tensor, approximate: str) -> Tensor:
    check_same_device("bias_gelu", x, bias=bias)
    return x.new_empty(x.shape)


@torch.library.register_fake("fastops::bias_gelu_backward")
def _bias_gelu_backward_fake(
    grad_out: Tensor, x: Tensor, bias: Tensor, approximate: str
) -> tuple[Tensor, Tensor]:
    torch._check(
        grad_out.shape == x.shape,
        lambda: f"fastops.bias_gelu_backward: expected grad_out to have the shape of x {tuple(x.shape)}",
    )
    return x.new_empty(x.shape), torch.empty_like(bias)


# Autograd is C++ (csrc/gelu_op.cpp): the ops' first derivative and the backward ops' own (double
# backward, gelu''). Autocast: none registered on purpose. Like aten::gelu, gelu and bias_gelu run in
# the dtype they receive (custom ops fall through the autocast key).
