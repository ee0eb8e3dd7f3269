"""Training steps/s of the main job's model: fastops (swapped modules + FusedAdamW) vs stock
(nn.Conv2d(groups=C), nn.GELU, nn.Linear, torch.optim.AdamW), eager and torch.compile'd.

One timed call is one full optimizer step of fastops.train.train_step: zero_grad, forward,
cross-entropy, backward, grad-norm clipping, optimizer step. Both providers start from the same
weights (the fastops model is the stock one after swap_modules) and see the same batch.

Configurations: ``digits`` (the default main job: 1x16x16 inputs, width 32, batch 64) and
``synthetic224`` (3x224x224, batch 256: the GPU throughput run). ``--profile`` prints where the
time of one step goes, per op, for both providers.

    python -m benchmarks.bench_train [--device cpu|cuda] [--quick] [--config digits synthetic224]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator

import torch

from benchmarks import common
from fastops.swap import swap_modules
from fastops.train import amp
from fastops.train.config import TrainConfig
from fastops.train.loop import train_step
from fastops.train.model import ConvNet
from fastops.train.trainer import make_optimizer
from fastops.tuner import TuneTable, tune

CONFIGS = {
    "digits": dict(in_channels=1, image_size=16, batch_size=64, width=32),
    "synthetic224": dict(in_channels=3, image_size=224, batch_size=256, width=32),
    # Real models nobody here wrote (timm, random init, 1000 classes): swapped vs stock.
    "mobilenetv3_large_100": dict(in_channels=3, image_size=224, batch_size=128, timm=True),
    "efficientnet_b0": dict(in_channels=3, image_size=224, batch_size=128, timm=True),
    "convnext_atto": dict(in_channels=3, image_size=224, batch_size=128, timm=True),
}


def make_step(provider: str, config: str, device: str, compiled: bool, amp_mode: str, memory_format):
    spec = CONFIGS[config]
    torch.manual_seed(0)
    num_classes = 10
    if spec.get("timm"):
        import timm

        num_classes = 1000
        model = timm.create_model(config, pretrained=False, num_classes=num_classes)
    else:
        model = ConvNet(
            spec["in_channels"], num_classes, spec["image_size"], width=spec["width"], dropout=0.1
        )
    return training_step(
        model,
        fastops=provider == "fastops",
        device=device,
        compiled=compiled,
        amp_mode=amp_mode,
        memory_format=memory_format,
        batch_size=spec["batch_size"],
        image_size=spec["image_size"],
        in_channels=spec["in_channels"],
        num_classes=num_classes,
    )


def training_step(
    model: torch.nn.Module,
    *,
    fastops: bool,
    device: str,
    compiled: bool,
    amp_mode: str,
    memory_format: torch.memory_format,
    batch_size: int,
    image_size: int,
    in_channels: int = 3,
    num_classes: int = 1000,
) -> Callable[[], None]:
    """One timed call of a training benchmark: a full optimizer step of fastops.train.train_step on a
    fixed random batch. ``fastops`` swaps the model's modules (fastops.swap_modules) and optimizes
    with FusedAdamW; otherwise the model stays stock with torch.optim.AdamW (foreach, torch's
    default). Both come from fastops.train's make_optimizer, so the hyperparameters and parameter
    groups are the trainer's. ``compiled`` wraps the model in torch.compile (after the swap, as the
    trainer does). The batch is drawn from a fixed seed: every provider sees the same one."""
    if fastops:
        swap_modules(model)
    model = model.to(device, memory_format=memory_format).train()
    optimizer = make_optimizer(model, TrainConfig(fastops=fastops))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch_size, in_channels, image_size, image_size, generator=g)
    x = x.to(device).contiguous(memory_format=memory_format)
    y = torch.randint(0, num_classes, (batch_size,), generator=g).to(device)
    dev = torch.device(device)
    scaler = amp.make_scaler(amp_mode, dev)
    tuning: TuneTable | None = None
    if fastops:
        # The kernel choices for this step, measured (or read from the cache) before any timing and
        # before torch.compile traces the model, in the autocast context the step runs in.
        with amp.autocast(amp_mode, dev):
            tuning = tune(model, x, training=True)
    runner = torch.compile(model) if compiled else model

    def step() -> None:
        train_step(
            runner,
            [(x, y)],
            optimizer=optimizer,
            scaler=scaler,
            autocast=lambda: amp.autocast(amp_mode, dev),
            grad_clip=1.0,
        )

    step.tuning = tuning  # type: ignore[attr-defined]  (what fastops.tune measured, for the notes)
    return step


def profile_step(step, device: str, title: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(5):
            step()
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    print(f"\n=== {title}: 5 steps ===")
    print(prof.key_averages().table(sort_by=sort, row_limit=18, max_name_column_width=48))


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", nargs="+", choices=sorted(CONFIGS), default=None)
    parser.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    parser.add_argument("--profile", action="store_true", help="print per-op profiles (eager) and exit")
    parser.add_argument(
        "--layout",
        choices=["channels_last", "nchw"],
        default="channels_last",
        help="memory format of the model and the batch (channels_last: the trainer's default)",
    )


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    device = args.device
    configs = args.config or (["digits", "synthetic224"] if device == "cuda" else ["digits"])
    memory_format = torch.channels_last if args.layout == "channels_last" else torch.contiguous_format
    if args.profile:  # prints instead of timing: no cases
        for config in configs:
            for provider in ("stock", "fastops"):
                profile_step(
                    make_step(provider, config, device, False, args.amp, memory_format),
                    device,
                    f"{config} {provider}",
                )
        return
    modes = ["eager"] + ([] if args.no_compile else ["compile"])
    dtype = {"none": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]
    for config in configs:
        batch = CONFIGS[config]["batch_size"]
        for mode in modes:
            steps = {
                p: make_step(p, config, device, mode == "compile", args.amp, memory_format)
                for p in ("fastops", "stock")
            }

            def rates(times: list[float], batch: int = batch) -> dict[str, float | str]:
                median = common.quantiles(times)[0]
                return {"steps_per_s": 1e3 / median, "samples_per_s": batch * 1e3 / median}

            size = f"batch {batch}" + ("" if args.layout == "channels_last" else ", NCHW")
            yield common.BenchCase(f"{config} {mode}", "step", dtype, size, steps, derived=rates)
            del steps


def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
    return (
        "One timed call = one optimizer step of fastops.train.train_step (zero_grad, forward, loss, "
        "backward, clip, optimizer step). 'fastops speedup' = stock median / fastops median, i.e. the "
        "steps/s ratio. The providers were timed interleaved, one step of each per round. "
        + (
            "CPU numbers come from a 2-core machine shared with other jobs: expect noise of 10-20%."
            if args.device == "cpu"
            else ""
        )
    )


def main() -> None:
    # Whole training steps: at least 3 s of them per provider (1 s under --quick).
    common.run_benchmark(
        "train",
        cases,
        description=__doc__.splitlines()[0],
        check_pairs=(("fastops", "stock"),),
        options=options,
        notes=notes,
        min_time=3.0,
        quick_min_time=1.0,
    )


if __name__ == "__main__":
    main()
