"""fastops.train: a training loop for any nn.Module with AMP, activation checkpointing, DDP or FSDP2
and atomic checkpoints, and the bundled job (a convnet of fastops blocks on scikit-learn's digits).

Library use::

    from fastops.train import fit, run
    summary = fit(my_model, train_dataset, val_dataset, epochs=10, amp="bf16", out_dir="runs/mine")
    summary = run(epochs=10, out_dir="runs/digits")  # the bundled job

Command line: ``python -m fastops.train --help`` (or the ``fastops-train`` script); multi-process:
``torchrun --standalone --nproc_per_node=N -m fastops.train ...``.
"""

from fastops.train.checkpoint import CheckpointError
from fastops.train.config import ConfigError, TrainConfig
from fastops.train.loop import StepResult, train_step
from fastops.train.trainer import NonFiniteLossError, Trainer, fit, run

__all__ = [
    "CheckpointError",
    "ConfigError",
    "NonFiniteLossError",
    "StepResult",
    "TrainConfig",
    "Trainer",
    "fit",
    "run",
    "train_step",
]
