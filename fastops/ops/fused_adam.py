"""fused_adam: one Adam / AdamW step over lists of tensors, as one kernel call per device.

The functional face of ``torch.ops.fastops.fused_adam_`` (the optimizer classes that call it live in
``fastops.optim``), and the op's fake kernel for torch.compile.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["fused_adam"]

# Bound once: saves the attribute lookups every step.
_fused_adam_op = torch.ops.fastops.fused_adam_.default


def _to(t: Tensor, device: torch.device) -> Tensor:
    """t on device. A copy into the CPU is blocking: the CPU kernel reads the value as soon as it is
    called, before an asynchronous device-to-host copy may have landed. A copy onto a device is
    ordered before the kernel by its stream, so it need not wait."""
    return t.to(device, non_blocking=device.type != "cpu")


def _local_shards(tensors: list[Tensor], like: list[Tensor], what: str) -> list[Tensor]:
    """The local shards of DTensors (FSDP2, tensor parallel), each checked to be laid out as its
    param is; plain tensors as they are."""
    from torch.distributed.tensor import DTensor

    out = []
    for t, p in zip(tensors, like, strict=True):
        if isinstance(t, DTensor):
            if not isinstance(p, DTensor) or t.placements != p.placements or t.device_mesh != p.device_mesh:
                raise RuntimeError(
                    f"fastops.fused_adam: {what} must be sharded like their params (a pointwise "
                    f"update over identical shards), got {t.placements} for a param with "
                    f"{getattr(p, 'placements', 'no sharding')}"
                )
            t = t.to_local()
        elif isinstance(p, DTensor) and t.dim() > 0:
            raise RuntimeError(
                f"fastops.fused_adam: {what} of a DTensor param must be DTensors sharded like it"
            )
        out.append(t)
    return out


def fused_adam(
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
    capturable: bool = False,
    grad_scale: Tensor | None = None,
    found_inf: Tensor | None = None,
) -> None:
    """Functional Adam/AdamW step over lists of tensors (one kernel call per device).

    Same arguments as ``torch.optim.adam.adam`` with ``fused=True``; ``state_steps`` are float32
    0-d tensors on each param's device and are incremented here (not by the caller), except when
    ``found_inf`` is nonzero: then params, grads, state and steps are all left untouched. With
    ``grad_scale`` the grads are divided by it and written back unscaled, as torch's fused Adam does.
    ``max_exp_avg_sqs`` is empty unless ``amsgrad``. See ``fastops.reference.fused_adam.adam_step``
    for the plain-PyTorch equivalent.

    A param listed k times (with the same grad, state and step each time, as an optimizer whose
    group repeats a param passes it; torch warns about such groups) is updated once per occurrence,
    in list order, each time with ``t = step + k``, and its step ends k higher (with
    ``grad_scale``, its grad is divided once per occurrence): what ``torch.optim.Adam(fused=True)``
    does on the CPU, here on every device. Different params must not share memory or a step
    tensor (RuntimeError), nor state tensors.

    DTensor params (FSDP2's ``fully_shard``, tensor parallel) take grads and state sharded the same
    way; each rank then runs the kernel on its local shards.

    ``lr`` may be a float or a 1-element tensor of any floating dtype. A float lr, or a CPU tensor lr
    (read on the host), is checked (>= 0, not NaN) by the kernel at every step, on every device. For
    CUDA params a CUDA tensor lr is read by the kernel on the device and not checked at step time
    (that would be a host sync; ``FusedAdam`` checks it when a group is made, as torch does). Device
    memory is read on the host only where CPU params need a device scalar (lr, ``grad_scale``,
    ``found_inf``): it is copied over blocking, since the CPU kernel reads it at once (and then
    checks that lr too).
    """
    if not params:
        return
    # One pass over the params for their devices and types (a step's host time is per param: 161
    # of them in ResNet-50).
    devices_seen = {p.device for p in params}
    if _any_dtensor({type(p) for p in params}):
        # The update is pointwise, and param, grad and state are sharded alike, so each rank
        # updates its own shards with the plain kernel: no communication, and the state stays
        # DTensors (state_dicts round-trip through torch.distributed.checkpoint).
        grads = _local_shards(grads, params, "grads")
        exp_avgs = _local_shards(exp_avgs, params, "exp_avgs")
        exp_avg_sqs = _local_shards(exp_avg_sqs, params, "exp_avg_sqs")
        if max_exp_avg_sqs:
            max_exp_avg_sqs = _local_shards(max_exp_avg_sqs, params, "max_exp_avg_sqs")
        params = _local_shards(params, params, "params")
    devices: dict[torch.device, list[int]] = {}
    if len(devices_seen) == 1:
        devices[next(iter(devices_seen))] = []  # one device: the lists go as they are
    else:
        for i, p in enumerate(params):
            devices.setdefault(p.device, []).append(i)
    for device, idx in devices.items():
        if capturable and device.type == "cpu" and not torch.compiler.is_compiling():
            # torch.optim.Adam refuses it, with this type: CUDA graphs capture no CPU step. (Dynamo
            # sets capturable on every optimizer it traces, CPU ones too: not the user's choice.)
            raise AssertionError(
                "fastops.optim: capturable=True needs the params on a device whose steps a graph can "
                "capture (cuda), got params on cpu; use capturable=False there"
            )
        sel: tuple[list[Tensor], ...]
        if len(devices) == 1:
            sel = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
        else:
            sel = tuple(
                [lst[i] for i in idx] if lst else []
                for lst in (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
            )
        lr_tensor: Tensor | None = None
        lr_float = 0.0
        if isinstance(lr, Tensor):
            if lr.device.type == "cpu" and device.type != "cpu" and capturable:
                raise RuntimeError(
                    "fastops.optim: with capturable=True a Tensor lr must live on the params' device "
                    f"({device}), got a CPU tensor (a graph replay would keep the value read at capture)"
                )
            # A CPU lr goes to the kernel of any device as it is: read (and checked) on the host.
            lr_tensor = lr if lr.device == device or lr.device.type == "cpu" else _to(lr, device)
        else:
            lr_float = float(lr)
        scale = _to(grad_scale, device) if grad_scale is not None else None
        inf = _to(found_inf, device) if found_inf is not None else None
        _fused_adam_op(
            *sel,
            lr_tensor,
            lr_float,
            beta1,
            beta2,
            weight_decay,
            eps,
            amsgrad,
            maximize,
            decoupled_weight_decay,
            scale,
            inf,
        )


def _any_dtensor(types: set[type]) -> bool:
    """Whether any of the params' types is a DTensor (subclass)."""
    if types <= _PLAIN_TYPES or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(issubclass(t, DTensor) for t in types)


_PLAIN_TYPES = {Tensor, torch.nn.Parameter}


@torch.library.register_fake("fastops::fused_adam_")
def _fused_adam_fake(
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    max_exp_avg_sqs: list[Tensor],
    steps: list[Tensor],
    lr_tensor: Tensor | None,
    lr: float,
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
    n = len(params)
    for name, lst in (
        ("grads", grads),
        ("exp_avgs", exp_avgs),
        ("exp_avg_sqs", exp_avg_sqs),
        ("steps", steps),
    ):
        torch._check(
            len(lst) == n, lambda name=name: f"fastops.fused_adam_: expected one {name} tensor per param"
        )
    torch._check(
        len(max_exp_avg_sqs) == (n if amsgrad else 0),
        lambda: "fastops.fused_adam_: max_exp_avg_sqs must hold one tensor per param with amsgrad, else none",
    )
    return None
