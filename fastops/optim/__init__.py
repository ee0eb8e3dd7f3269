"""Fused optimizers: the whole step of every param in one kernel per device."""

from fastops.optim.fused_adam import FusedAdam, FusedAdamW

__all__ = ["FusedAdam", "FusedAdamW"]
