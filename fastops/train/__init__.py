"""fastops.train: a training loop with AMP, activation checkpointing, DDP and atomic checkpoints,
and the main job (a convnet of fastops blocks on scikit-learn's digits).

Library use::

    from fastops.train import TrainConfig, fit
    summary = fit(TrainConfig(epochs=10, amp="bf16", out_dir="runs/digits"))

Command line: ``python -m fastops.train --help`` (or the ``fastops-train`` script); multi-process:
``torchrun --standalone --nproc_per_node=N -m fastops.train ...``.
"""

from fastops.train.checkpoint import CheckpointError
from fastops.train.config import ConfigError, TrainConfig
from fastops.train.loop import StepResult, train_step
from fastops.train.trainer import NonFiniteLossError, Trainer, fit

__all__ = [
    "CheckpointError",
    "ConfigError",
    "NonFiniteLossError",
    "StepResult",
    "TrainConfig",
    "Trainer",
    "fit",
    "train_step",
]
