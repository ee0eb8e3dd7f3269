"""FusedAdam / FusedAdamW: torch.optim.Adam / AdamW with the whole step in one kernel per device.

Each ``step()`` makes one call of ``torch.ops.fastops.fused_adam_`` per param group and device. The
kernel reads every param, grad and moment once and writes them once (28 bytes per fp32 param), for
all tensors of the group at once: one multi-tensor launch on CUDA, one parallel loop on the CPU.
The optimizer classes only; the functional op and its fake kernel live in ``fastops.ops.fused_adam``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.optim.optimizer import Optimizer, ParamsT

from fastops.ops.fused_adam import fused_adam

__all__ = ["FusedAdam", "FusedAdamW"]


def _as_float(cls: str, name: str, value: object) -> float:
    """The number torch.optim.Adam compares with its bounds (a real number or a 1-element tensor),
    failing as that comparison would: TypeError for other types, RuntimeError for a tensor that does
    not hold exactly one element."""
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise RuntimeError(
                f"fastops.optim.{cls}: expected {name} to be a number or a 1-element Tensor, "
                f"got a Tensor of {value.numel()} elements"
            )
        return float(value.item())
    if not isinstance(value, numbers.Real):
        raise TypeError(
            f"fastops.optim.{cls}: expected {name} to be a number or a 1-element Tensor, "
            f"got {type(value).__name__}"
        )
    return float(value)


def _pair(cls: str, betas: Any) -> tuple[Any, Any]:
    """betas[0], betas[1]; what indexing raises (IndexError, KeyError, TypeError) keeps its type, as
    in torch.optim.Adam. A longer sequence fails here rather than at the first step (ValueError)."""
    try:
        beta1, beta2 = betas[0], betas[1]
    except (LookupError, TypeError) as e:
        raise type(e)(f"fastops.optim.{cls}: betas must be a pair (beta1, beta2), got {betas!r}") from None
    if hasattr(betas, "__len__") and len(betas) != 2:
        raise ValueError(f"fastops.optim.{cls}: betas must be a pair (beta1, beta2), got {betas!r}")
    return beta1, beta2


def _check_hyper(
    cls: str, lr: Any, betas: Any, eps: Any, weight_decay: Any, foreach: Any = None, capturable: Any = False
) -> None:
    """torch.optim.Adam's checks, in its order and with its exception types (NaN fails the bounds)."""
    if isinstance(lr, Tensor):
        if foreach and not capturable:
            raise ValueError(
                f"fastops.optim.{cls}: lr as a Tensor is not supported for capturable=False and foreach=True"
            )
        if lr.numel() != 1:
            raise ValueError(f"fastops.optim.{cls}: Tensor lr must be 1-element, got {lr.numel()} elements")
    lr_value = _as_float(cls, "lr", lr)
    if not lr_value >= 0.0:
        raise ValueError(f"fastops.optim.{cls}: invalid learning rate: {lr_value} (expected lr >= 0)")
    eps_value = _as_float(cls, "eps", eps)
    if not eps_value >= 0.0:
        raise ValueError(f"fastops.optim.{cls}: invalid epsilon value: {eps_value} (expected eps >= 0)")
    for i, beta in enumerate(_pair(cls, betas)):
        value = _as_float(cls, f"betas[{i}]", beta)
        if not 0.0 <= value < 1.0:
            raise ValueError(
                f"fastops.optim.{cls}: invalid beta parameter at index {i}: {value} (expected [0, 1))"
            )
    wd_value = _as_float(cls, "weight_decay", weight_decay)
    if not wd_value >= 0.0:
        raise ValueError(f"fastops.optim.{cls}: invalid weight_decay value: {wd_value} (expected >= 0)")
    beta1, beta2 = _pair(cls, betas)
    if not (
        (isinstance(beta1, float) and isinstance(beta2, float))
        or (isinstance(beta1, Tensor) and isinstance(beta2, Tensor))
    ):
        raise ValueError(
            f"fastops.optim.{cls}: betas must be either both floats or both Tensors, "
            f"got {type(beta1).__name__} and {type(beta2).__name__}"
        )
    if isinstance(beta1, Tensor) and foreach and not capturable:
        raise ValueError(
            f"fastops.optim.{cls}: betas as Tensors are not supported for capturable=False and foreach=True"
        )


def _to_scalar(beta: float | Tensor) -> float | Tensor:
    """torch.optim's form of a beta: a Tensor squeezed to 0-d (a view: in-place changes to the
    caller's tensor still reach the optimizer), a float as it is."""
    return beta.squeeze() if isinstance(beta, Tensor) and beta.dim() != 0 else beta


class FusedAdam(Optimizer):
    r"""torch.optim.Adam with the step fused into one kernel per device (CPU and CUDA).

    Drop-in for ``torch.optim.Adam``: same arguments, defaults, math (L2 weight decay added to the
    gradient; ``decoupled_weight_decay=True`` gives AdamW), param groups, and ``state_dict`` layout
    (per param ``step``, ``exp_avg``, ``exp_avg_sq`` and, with amsgrad, ``max_exp_avg_sq``), so a
    checkpoint written by torch.optim.Adam loads here and continues identically, and the reverse.

    Args:
        params: iterable of parameters or param-group dicts (each group may override any argument).
        lr: learning rate, a float or a 1-element floating tensor (a scheduler may change it between
            steps). Checked (>= 0, not NaN) here and in ``add_param_group``. A float or a CPU tensor
            lr is also checked at every step, on every device (a negative or NaN value raises); a
            tensor lr on the params' device is read by the kernel there, without a host sync, and so
            is not checked again at step time, as in torch's fused Adam.
        betas: (beta1, beta2) in [0, 1), both floats or both 1-element tensors. Tensors are kept
            in ``param_groups`` (squeezed to 0-d, as torch does) and read at every step, so a
            change made in place reaches the next step. eps, weight_decay: >= 0.
        amsgrad: keep the running maximum of the second moment and normalise by it.
        maximize: ascend instead of descend.
        capturable: the step is always free of host syncs (``step`` lives on the param's device,
            as in torch's fused Adam, and a Tensor lr on that device is read by the kernel); with
            ``capturable=True`` a CPU tensor lr for CUDA params is refused, since a CUDA graph would
            replay the value read at capture. Capture a whole training step with
            ``torch.cuda.graph`` after a few warm-up steps on a side stream, as for torch's Adam.
        foreach, fused, differentiable: accepted for signature compatibility; this optimizer is
            always fused and not differentiable: ``foreach=True``, ``fused=False`` or
            ``differentiable=True`` raise RuntimeError, as torch's fused Adam does for the first
            and the last. Every other argument error has the exception type torch.optim.Adam
            raises for it.

    Dtypes: float32, float16 and bfloat16 params (float64 on the CPU); the math runs in float32
    (float64 for float64 params) and the state has the param's dtype, as in torch. Params of one
    group may mix devices and dtypes. Gradients must be dense and real: sparse gradients and
    complex params raise. Under ``torch.amp.GradScaler`` the scale is divided out inside the kernel
    (``_step_supports_amp_scaling``): grads are written back unscaled, and when an inf/NaN was found
    the whole step is skipped on the device, with the step count left as it was.
    """

    _decoupled_default = False

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: bool | None = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        cls = type(self).__name__
        _check_hyper(cls, lr, betas, eps, weight_decay, foreach, capturable)
        # Tensor betas are kept, not read: like torch, every step reads their value then.
        defaults = {
            "lr": lr,
            "betas": tuple(_to_scalar(beta) for beta in _pair(cls, betas)),
            "eps": eps,
            "weight_decay": weight_decay,
            "amsgrad": amsgrad,
            "maximize": maximize,
            "foreach": foreach,
            "capturable": capturable,
            "differentiable": differentiable,
            "fused": fused,
            "decoupled_weight_decay": decoupled_weight_decay,
        }
        super().__init__(params, defaults)
        # After the params are checked and with torch's exception type (RuntimeError), as
        # torch.optim.Adam(fused=True) does, so that a drop-in fails the way the original fails.
        if differentiable:
            raise RuntimeError(f"fastops.optim.{cls} is fused and does not support differentiable=True")
        if foreach:
            raise RuntimeError(
                f"fastops.optim.{cls} is fused; fused and foreach=True cannot be used together"
            )
        if fused is False:
            raise RuntimeError(f"fastops.optim.{cls} is always fused; use torch.optim for fused=False")
        # torch.amp.GradScaler then hands us grad_scale / found_inf instead of unscaling itself.
        self._step_supports_amp_scaling = True

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        # Checked before the group is added, so a rejected group leaves the optimizer as it was
        # (torch.optim.Adam checks only its constructor's arguments; the bounds are the same).
        merged = {**self.defaults, **param_group}
        _check_hyper(
            type(self).__name__, merged["lr"], merged["betas"], merged["eps"], merged["weight_decay"]
        )
        super().add_param_group(param_group)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Also runs at the end of load_state_dict: fill in keys older checkpoints lack and move each
        # step to its param's device as float32 (torch.optim.Adam keeps it on the CPU by default).
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("amsgrad", False)
            group.setdefault("maximize", False)
            group.setdefault("foreach", None)
            group.setdefault("capturable", False)
            group.setdefault("differentiable", False)
            group.setdefault("fused", None)
            group.setdefault("decoupled_weight_decay", self._decoupled_default)
            if self._decoupled_default:
                group["decoupled_weight_decay"] = True
            for p in group["params"]:
                p_state = self.state.get(p)
                if p_state and "step" in p_state:
                    # A copy: load_state_dict hands over the source's own step tensor otherwise.
                    step = torch.as_tensor(p_state["step"]).detach()
                    p_state["step"] = step.to(dtype=torch.float32, device=p.device, copy=True).reshape(())

    def _init_group(
        self,
        group: dict[str, Any],
        params: list[Tensor],
        grads: list[Tensor],
        exp_avgs: list[Tensor],
        exp_avg_sqs: list[Tensor],
        max_exp_avg_sqs: list[Tensor],
        state_steps: list[Tensor],
    ) -> bool:
        """Collects the params with a grad and their state, creating the state on first use
        (torch.optim.Adam's _init_group contract, which torch.compile runs eagerly)."""
        # Locals and bound methods: this loop runs once per param per step.
        amsgrad = group["amsgrad"]
        state_of = self.state
        add_param, add_grad, add_steps = params.append, grads.append, state_steps.append
        add_avg, add_avg_sq, add_max = exp_avgs.append, exp_avg_sqs.append, max_exp_avg_sqs.append
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError(
                    f"fastops.optim.{type(self).__name__} does not support sparse gradients, "
                    "please consider torch.optim.SparseAdam instead"
                )
            if p.is_complex():
                raise RuntimeError(
                    f"fastops.optim.{type(self).__name__} does not support complex params; "
                    "optimize torch.view_as_real(p) or use torch.optim.Adam"
                )
            state = state_of[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if amsgrad:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif amsgrad and "max_exp_avg_sq" not in state:
                state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            add_param(p)
            add_grad(grad)
            add_avg(state["exp_avg"])
            add_avg_sq(state["exp_avg_sq"])
            if amsgrad:
                add_max(state["max_exp_avg_sq"])
            add_steps(state["step"])
        return False

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One optimisation step for every param with a grad. closure: re-evaluates the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Set by torch.amp.GradScaler.step for the duration of this call (None after unscale_()).
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            exp_avgs: list[Tensor] = []
            exp_avg_sqs: list[Tensor] = []
            max_exp_avg_sqs: list[Tensor] = []
            state_steps: list[Tensor] = []
            self._init_group(group, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
            # Tensor betas are read here, at every step (a host sync for device tensors, as in
            # torch's fused Adam, whose kernel takes them as floats too).
            beta1, beta2 = group["betas"]
            fused_adam(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                max_exp_avg_sqs,
                state_steps,
                lr=group["lr"],
                beta1=float(beta1),
                beta2=float(beta2),
                weight_decay=float(group["weight_decay"]),
                eps=float(group["eps"]),
                amsgrad=group["amsgrad"],
                maximize=group["maximize"],
                decoupled_weight_decay=group["decoupled_weight_decay"],
                capturable=group["capturable"],
                grad_scale=grad_scale,
                found_inf=found_inf,
            )
        return loss


class FusedAdamW(FusedAdam):
    r"""torch.optim.AdamW (decoupled weight decay, default ``weight_decay=1e-2``) fused; see FusedAdam.

    ``p *= 1 - lr * weight_decay`` before the Adam update, as in torch.optim.AdamW; state_dicts are
    interchangeable with torch.optim.AdamW's.
    """

    _decoupled_default = True

    def __init__(
        self,
        params: ParamsT,
        lr: float | Tensor = 1e-3,
        betas: tuple[float | Tensor, float | Tensor] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        foreach: bool | None = None,
        capturable: bool = False,
        differentiable: bool = False,
        fused: bool | None = None,
    ) -> None:
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            decoupled_weight_decay=True,
        )
