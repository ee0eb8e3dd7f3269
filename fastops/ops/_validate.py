"""Argument checks shared by the Python faces of the ops (run before dispatch and in fake kernels,
so eager, torch.compile and the C++ kernels reject the same inputs with the same words)."""

from __future__ import annotations

import math
import numbers

import torch

FLOATING_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(op: str, arg: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"fastops.{op}: expected {arg} to be a torch.Tensor, got {type(value).__name__}")
    return value


def check_floating(op: str, arg: str, t: torch.Tensor) -> None:
    ok = t.dtype in FLOATING_DTYPES or (t.dtype == torch.float64 and t.device.type == "cpu")
    if not ok:
        extra = " (or float64 on the CPU)" if t.device.type == "cpu" else ""
        raise TypeError(
            f"fastops.{op}: expected {arg} to be a float32, float16 or bfloat16 tensor{extra}, "
            f"got {t.dtype} on {t.device}"
        )


def check_positive_float(op: str, arg: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"fastops.{op}: expected {arg} to be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"fastops.{op}: expected {arg} to be a finite number > 0, got {value}")
    return value
