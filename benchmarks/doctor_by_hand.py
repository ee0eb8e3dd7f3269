"""Check a fastops.doctor recommendation by applying it by hand, in a plain training loop of its own.

    python -m benchmarks.doctor_by_hand --doctor-json runs/doctor/doctor.json [--rounds 3]

Reads the recommended levers and the window length from doctor.json (pass the model and data
options the doctor had again), then alternates baseline and recommended legs, each a fresh process
(the allocator levers are environment variables), and prints both throughputs and the speedup next
to the doctor's. Each lever is written out here as a user would write it, not through the doctor's
trial code.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import fastops
from fastops.doctor.levers import GLIBC_KEEP_MEMORY, preload_library
from fastops.train.config import TrainConfig
from fastops.train.data import build_data
from fastops.train.model import model_from_config


def leg(args: argparse.Namespace) -> float:
    """One configuration: train ``--warmup`` steps, then time ``--windows`` windows of ``--steps``;
    returns the median samples/s."""
    levers = set(args.levers)
    if args.threads:
        torch.set_num_threads(args.threads)
    scale = 4 if "batch-x4" in levers else 2 if "batch-x2" in levers else 1
    cfg = TrainConfig(
        model=args.model, dataset=args.data, image_size=args.image_size, batch_size=args.batch_size * scale
    )
    data = build_data(cfg, rank=0, world_size=1, device=torch.device("cpu"))
    model = model_from_config(cfg, in_channels=data.in_channels, num_classes=data.num_classes)
    if "fastops-swap" in levers:
        fastops.swap_modules(model)
    fmt = torch.channels_last if "channels-last" in levers else torch.contiguous_format
    model = model.to(memory_format=fmt).train()  # type: ignore[call-overload]
    params = list(model.parameters())
    if "fused-adamw" in levers:
        optimizer: torch.optim.Optimizer = fastops.optim.FusedAdamW(params, lr=1e-3)
    elif "adamw-foreach" in levers:
        optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=True)
    elif "adamw-fused" in levers:
        optimizer = torch.optim.AdamW(params, lr=1e-3, fused=True)
    else:
        optimizer = torch.optim.AdamW(params, lr=1e-3)
    step_model = torch.compile(model) if "compile" in levers else model
    dtype = torch.bfloat16 if "amp-bf16" in levers else None
    workers = 1 if "loader-workers" in levers else 0
    loader = (
        torch.utils.data.DataLoader(
            data.train.dataset,  # type: ignore[union-attr]
            batch_size=cfg.batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=workers,
            persistent_workers=workers > 0,
        )
        if hasattr(data.train, "dataset")
        else None
    )
    fixed = next(iter(data.train))

    def batches():
        while True:
            if loader is None:
                yield fixed
            else:
                yield from loader

    it = batches()

    def step() -> None:
        x, y = next(it)
        x = x.to(memory_format=fmt)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = torch.nn.functional.cross_entropy(step_model(x).float(), y)
        loss.backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.windows):
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        rates.append(args.steps * cfg.batch_size / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--doctor-json", type=Path, required=True)
    p.add_argument("--model", default="convnet")
    p.add_argument("--data", default="digits")
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3, help="baseline/recommended pairs, alternated")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--steps", type=int, default=0, help="steps per window (default: the doctor's)")
    p.add_argument("--check", nargs="+", metavar="LEVER", help="these levers instead of the recommended ones")
    p.add_argument("--leg", nargs="*", dest="levers", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    report = json.loads(args.doctor_json.read_text())
    args.steps = args.steps or report["steps_per_window"]
    if args.levers is not None:  # a leg, in its own process
        print(json.dumps({"samples_per_s": leg(args)}))
        return
    recommended = args.check or report["recommended"]
    env = dict(os.environ)
    if "glibc-malloc" in recommended:
        env.update(GLIBC_KEEP_MEMORY)
    for name in ("jemalloc", "tcmalloc"):
        if name in recommended:
            env["LD_PRELOAD"] = preload_library(name) or ""
    common = [
        sys.executable,
        "-m",
        "benchmarks.doctor_by_hand",
        *("--doctor-json", str(args.doctor_json), "--model", args.model, "--data", args.data),
        *("--image-size", str(args.image_size), "--batch-size", str(args.batch_size)),
        *("--threads", str(args.threads), "--warmup", str(args.warmup), "--windows", str(args.windows)),
        *("--steps", str(args.steps)),
    ]
    rates: dict[str, list[float]] = {"baseline": [], "recommended": []}
    for _ in range(args.rounds):
        for name, levers, leg_env in (("baseline", [], os.environ), ("recommended", recommended, env)):
            out = subprocess.run(
                [*common, "--leg", *levers], env=dict(leg_env), check=True, capture_output=True, text=True
            )
            rates[name].append(json.loads(out.stdout.strip().splitlines()[-1])["samples_per_s"])
    base, rec = statistics.median(rates["baseline"]), statistics.median(rates["recommended"])
    combo = report["combination"] or {}
    doctor_speedup = next(
        (o["speedup"] for o in [*report["levers"], combo] if o and o["name"] == " + ".join(recommended)),
        None,
    )
    print(
        f"checked: {' + '.join(recommended) or '(nothing)'}; the doctor recommended {report['recommended']}"
    )
    print(f"baseline    samples/s per round: {', '.join(f'{r:.1f}' for r in rates['baseline'])}")
    print(f"checked     samples/s per round: {', '.join(f'{r:.1f}' for r in rates['recommended'])}")
    line = f"by hand: {rec / base:.3f}x"
    if doctor_speedup:
        line += f"; the doctor: {doctor_speedup:.3f}x; ratio {rec / base / doctor_speedup:.3f}"
    print(line)


if __name__ == "__main__":
    main()
