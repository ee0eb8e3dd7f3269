"""``python -m fastops.doctor``: the model and data named as fastops.train names them, then examine()."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from fastops.doctor.examine import DEFAULT_BUDGET_S, examine
from fastops.doctor.levers import levers
from fastops.train.cli import _add_option, config_from_args
from fastops.train.config import ConfigError, TrainConfig

# The TrainConfig settings that mean the same to the doctor, parsed by fastops.train's own parser code.
SHARED = (
    "model",
    "blocks",
    "pretrained",
    "dataset",
    "image_size",
    "num_classes",
    "width",
    "batch_size",
    "device",
    "threads",
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m fastops.doctor",
        description=(
            "Try the speed levers of the PyTorch guides (AMP, channels_last, fastops modules, fused "
            "optimizers, cudnn.benchmark, torch.compile, activation checkpointing, batch size, "
            "DataLoader workers, the CPU allocator) on a model, each in a short training run of its "
            "own process, and report which to apply."
        ),
    )
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    what = p.add_argument_group("what to examine (as fastops.train)")
    for name in SHARED:
        _add_option(what, fields[name])
    run = p.add_argument_group("the doctor")
    run.add_argument(
        "--budget",
        type=float,
        metavar="S",
        help="seconds for the whole run (default: "
        + ", ".join(f"{k} {v:.0f}" for k, v in DEFAULT_BUDGET_S.items())
        + ")",
    )
    run.add_argument(
        "--levers",
        nargs="+",
        metavar="NAME",
        choices=[lever.name for lever in levers()],
        help="only these levers, of: " + " ".join(lever.name for lever in levers()),
    )
    run.add_argument(
        "--out-dir",
        type=Path,
        default=Path("runs/doctor"),
        help="doctor.md, .json and .png (default: runs/doctor)",
    )
    return p


def _doctor_error(parser: argparse.ArgumentParser, e: Exception) -> None:
    parser.error(str(e).replace("fastops.train:", "fastops.doctor:", 1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.budget is not None and not args.budget > 0:
        parser.error(f"fastops.doctor: --budget must be a positive number of seconds, got {args.budget}")
    # --model package.module:factory imports the user's code from the working directory, as
    # ``python -m`` does; spawned trial processes inherit this sys.path.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    args.baseline = False  # config_from_args reads it: the model is built with stock modules
    try:
        cfg = config_from_args(args).validate()
    except ConfigError as e:
        _doctor_error(parser, e)

    from fastops.train.data import build_data
    from fastops.train.model import model_from_config

    device = cfg.resolved_device()
    try:
        # Built on the CPU: the doctor sends it to each trial process, which moves it to the device.
        data = build_data(cfg, rank=0, world_size=1, device=torch.device("cpu"))
        model = model_from_config(cfg, in_channels=data.in_channels, num_classes=data.num_classes)
    except ConfigError as e:
        _doctor_error(parser, e)
    example = tuple(next(iter(data.train)))
    # A DataLoader's Dataset goes to the trials (the loader lever applies); synthetic data is the
    # example batch, device-resident in every step.
    dataset = getattr(data.train, "dataset", None)
    report = examine(
        model,
        example,
        data=dataset,
        device=device,
        budget_s=args.budget,
        blocks=cfg.blocks or None,
        levers=args.levers,
        threads=cfg.threads,
    )
    written = report.write(args.out_dir)  # no doctor.png without matplotlib
    print()
    print(report.table())
    print(f"\nwrote {', '.join(str(path) for path in written)}")
    return 0
