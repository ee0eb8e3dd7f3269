"""fastops.doctor: the speed advice of the PyTorch guides, measured on your model and machine.

Mixed precision, channels_last, fastops' modules, a fused optimizer, cudnn.benchmark,
torch.compile, activation checkpointing, a larger batch, DataLoader workers, the CPU's memory
allocator: whether each helps depends on the model and the machine. The doctor tries each one
alone, then the best together, each in a short real training run in its own process (a crash or
out-of-memory ends that trial, not the doctor), and reports a ranked table with a verdict per lever
("apply" when its whole noise band is above 1.03x, "slower" below 0.97x, else "no gain"; "failed:
reason"), the lines of code that apply it, and one profiled step of the winner.

    report = fastops.doctor.examine(model, (x, y), budget_s=300, out_dir="runs/doctor")
    print(report.table())

Command line: ``python -m fastops.doctor --model timm:efficientnet_b0 --data synthetic --image-size 128``.
The levers are a registry (:mod:`fastops.doctor.levers`): a new one is one :func:`register_lever`.
"""

from fastops.doctor.examine import DEFAULT_BUDGET_S, Doctor, default_blocks, examine
from fastops.doctor.levers import Context, Lever, TrialConfig, levers, register_lever
from fastops.doctor.report import Outcome, Report, speedup_band, verdict

__all__ = [
    "DEFAULT_BUDGET_S",
    "Context",
    "Doctor",
    "Lever",
    "Outcome",
    "Report",
    "TrialConfig",
    "default_blocks",
    "examine",
    "levers",
    "register_lever",
    "speedup_band",
    "verdict",
]
