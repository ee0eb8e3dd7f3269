"""Mixed precision: the autocast context and the GradScaler for each --amp mode.

* ``none``: fp32; the scaler is disabled (its scale/unscale_/step/update are pass-throughs).
* ``bf16``: autocast to bfloat16 on CPU or CUDA. bf16 has fp32's exponent range, so gradients do
  not underflow and no loss scaling is needed.
* ``fp16``: autocast to float16 on CUDA with a dynamic GradScaler: the loss is multiplied by the
  scale before backward; ``unscale_`` divides the grads and records, on the device, whether any is
  inf/NaN; ``step`` then skips the optimizer step for that iteration and ``update`` halves the scale
  (and grows it again after ``growth_interval`` clean steps).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def dtype(amp: str) -> torch.dtype | None:
    """The low-precision dtype of ``amp``; None for "none"."""
    return _DTYPES.get(amp)


def autocast(amp: str, device: torch.device) -> AbstractContextManager:
    """The forward-pass context for ``amp`` (a no-op for "none")."""
    if amp == "none":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=_DTYPES[amp])


def make_scaler(amp: str, device: torch.device, **kwargs: float | int) -> torch.amp.GradScaler:
    """A GradScaler enabled for fp16 only. ``torch.amp.GradScaler(device.type)`` also exists for the
    CPU, which is what lets the scaler logic be tested without a GPU."""
    return torch.amp.GradScaler(device.type, enabled=amp == "fp16", **kwargs)  # type: ignore[arg-type]
