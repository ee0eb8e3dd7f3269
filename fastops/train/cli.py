"""Command line of fastops.train: ``python -m fastops.train`` / ``fastops-train`` / under torchrun."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastops.train.config import (
    AMP_CHOICES,
    DEVICE_CHOICES,
    NONFINITE_CHOICES,
    NUMBERS,
    ConfigError,
    TrainConfig,
)

DEFAULTS = TrainConfig()


def _number_option(group: Any, flag: str, **kwargs: Any) -> None:
    """An option for a numeric TrainConfig field: the field's Number parses and checks it, so a bad
    value is an argparse error ("argument --lr: expected a finite number > 0, got inf", exit code 2)
    before anything is built, with the same words TrainConfig.validate uses for the field."""
    name = flag.removeprefix("--").replace("-", "_")
    spec = NUMBERS[name]

    def parse(text: str) -> int | float:
        try:
            return spec.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    kwargs.setdefault("default", getattr(DEFAULTS, name))
    kwargs["help"] = "; ".join(filter(None, (kwargs.get("help"), spec.describe())))
    group.add_argument(flag, type=parse, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastops-train",
        description=(
            "Train a convnet of fastops blocks (depthwise-separable convs, GELU, squeeze-excitation, "
            "BatchNorm) on scikit-learn's handwritten digits, or on synthetic images. "
            "Multi-process: torchrun --standalone --nproc_per_node=N -m fastops.train [options]."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    mode = p.add_argument_group("what to run")
    which = mode.add_mutually_exclusive_group()
    which.add_argument(
        "--baseline",
        action="store_true",
        help="stock PyTorch modules and torch.optim.AdamW instead of fastops",
    )
    which.add_argument(
        "--compare",
        action="store_true",
        help="run fastops and the baseline, print a table and write compare.png into --out-dir",
    )
    mode.add_argument(
        "--synthetic", action="store_true", help="random images (throughput runs) instead of digits"
    )
    _number_option(mode, "--image-size", default=None, help="image side (default: 16 digits, 224 synthetic)")
    _number_option(mode, "--num-classes", help="synthetic only")
    _number_option(mode, "--synthetic-samples", help="per epoch and rank")
    _number_option(mode, "--width", help="channels of the first stage")
    _number_option(mode, "--dropout")
    mode.add_argument("--no-augment", action="store_true", help="no random translations of the digits")

    opt = p.add_argument_group("optimization")
    _number_option(opt, "--epochs", default=None, help="default: 30 digits, 3 synthetic")
    _number_option(opt, "--batch-size", help="per process")
    _number_option(opt, "--accum-steps", help="micro-batches per step")
    _number_option(opt, "--lr", help="OneCycleLR peak learning rate")
    _number_option(opt, "--weight-decay")
    _number_option(opt, "--grad-clip", help="0 disables")
    _number_option(opt, "--patience", help="early stopping; 0 disables")
    _number_option(opt, "--seed")

    run = p.add_argument_group("execution")
    run.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULTS.device)
    run.add_argument("--amp", choices=AMP_CHOICES, default=DEFAULTS.amp, help="fp16 needs CUDA")
    run.add_argument("--checkpointing", action="store_true", help="activation checkpointing of the blocks")
    run.add_argument(
        "--channels-last",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="NHWC activations (default: on)",
    )
    run.add_argument("--compile", action="store_true", help="torch.compile the model")
    _number_option(run, "--num-workers", help="DataLoader workers")
    _number_option(
        run,
        "--threads",
        help="CPU intra-op threads per process (0: torch's default); 1 is fastest for the small "
        "digits model on a machine shared with other jobs",
    )
    run.add_argument(
        "--nonfinite",
        choices=NONFINITE_CHOICES,
        default=DEFAULTS.nonfinite,
        help="on a NaN/inf training or validation loss",
    )
    _number_option(run, "--log-every", help="steps between syncs")
    run.add_argument("--profile", action="store_true", help="torch.profiler trace of a few steps")
    run.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")

    out = p.add_argument_group("output")
    out.add_argument("--out-dir", type=Path, default=DEFAULTS.out_dir, help="run directory")
    out.add_argument("--resume", type=Path, default=None, help="continue from this checkpoint (last.pt)")
    _number_option(out, "--stop-after-epoch", help="stop this invocation there")
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    dataset = "synthetic" if args.synthetic else "digits"
    return TrainConfig(
        dataset=dataset,
        image_size=args.image_size or (224 if args.synthetic else DEFAULTS.image_size),
        num_classes=args.num_classes,
        synthetic_samples=args.synthetic_samples,
        width=args.width,
        dropout=args.dropout,
        augment=not args.no_augment,
        fastops=not args.baseline,
        epochs=args.epochs or (3 if args.synthetic else DEFAULTS.epochs),
        batch_size=args.batch_size,
        accum_steps=args.accum_steps,
        lr=args.lr,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        patience=args.patience,
        seed=args.seed,
        device=args.device,
        amp=args.amp,
        checkpointing=args.checkpointing,
        channels_last=args.channels_last,
        compile=args.compile,
        num_workers=args.num_workers,
        threads=args.threads,
        nonfinite=args.nonfinite,
        log_every=args.log_every,
        profile=args.profile,
        out_dir=args.out_dir,
        resume=args.resume,
        stop_after_epoch=args.stop_after_epoch,
        progress=not args.no_progress,
    )


def compare_table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown table: accuracy, throughput and memory of each run, and fastops / stock ratios."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.2f}%"

    rows = [
        "| run | test acc | best val acc | train loss | samples/s | peak memory (MB) | epochs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in results.items():
        rows.append(
            f"| {name} | {pct(s['test_accuracy'])} | {pct(s['val_accuracy'])} | {s['train_loss']:.4f} | "
            f"{s['samples_per_s']:.1f} | {s['peak_memory_mb']:.0f} | {s['epochs']} |"
        )
    if set(results) == {"fastops", "stock"} and results["stock"]["samples_per_s"]:
        ratio = results["fastops"]["samples_per_s"] / results["stock"]["samples_per_s"]
        rows.append(f"\nfastops / stock throughput: {ratio:.2f}x")
    return "\n".join(rows)


def _fit_in_child(cfg: TrainConfig, queue: Any) -> None:
    from fastops.train.trainer import Trainer

    try:
        queue.put(("ok", Trainer.from_config(cfg).fit()))
    except BaseException as e:  # report, then let the parent raise
        queue.put(("error", f"{type(e).__name__}: {e}"))


def _fit_isolated(cfg: TrainConfig) -> dict[str, Any]:
    """Run one leg of --compare in a fresh process, so its peak memory (the process's peak RSS on
    the CPU) is its own and not the maximum over both legs."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_fit_in_child, args=(cfg, queue))
    proc.start()
    status, payload = queue.get()
    proc.join()
    if status != "ok":
        raise RuntimeError(
            f"fastops.train --compare: the {'fastops' if cfg.fastops else 'stock'} run failed: {payload}"
        )
    return payload


def run_compare(cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Train the fastops and the stock model with the same settings and seed; table + bar chart.

    Single process: each leg runs in its own spawned process (clean peak-memory numbers). Under
    torchrun the legs run one after the other in the ranks' processes; CUDA peak memory is reset
    per leg, CPU peak RSS is then the maximum over the legs so far.
    """
    from fastops.train import distributed
    from fastops.train.metrics import write_json
    from fastops.train.plots import plot_compare
    from fastops.train.trainer import Trainer

    info = distributed.setup(cfg.resolved_device())
    results: dict[str, dict[str, Any]] = {}
    for name, use_fastops in (("fastops", True), ("stock", False)):
        sub = cfg.replace(fastops=use_fastops, out_dir=Path(cfg.out_dir) / name)
        results[name] = Trainer.from_config(sub).fit() if info.enabled else _fit_isolated(sub)
    if info.is_main:
        table = compare_table(results)
        print(table)
        (Path(cfg.out_dir) / "compare.md").write_text(table + "\n")
        write_json(Path(cfg.out_dir) / "compare.json", results)
        plot_compare(results, Path(cfg.out_dir) / "compare.png")
        print(f"wrote {Path(cfg.out_dir) / 'compare.png'}")
    distributed.barrier(info)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        cfg = config_from_args(args).validate()
    except ConfigError as e:
        parser.error(str(e))  # exits with status 2 and the usage line

    from fastops.train import distributed
    from fastops.train.trainer import NonFiniteLossError, Trainer

    try:
        if args.compare:
            run_compare(cfg)
        else:
            trainer = Trainer.from_config(cfg)
            summary = trainer.fit()
            if trainer.is_main:
                acc = summary["test_accuracy"]
                print(
                    f"done: {summary['epochs']} epochs ({summary['stopped']}), best val acc "
                    f"{100 * (summary['val_accuracy'] or 0):.2f}%"
                    + (f", held-out test acc {100 * acc:.2f}%" if acc is not None else "")
                    + f", {summary['samples_per_s'] or 0:.1f} samples/s; results in {cfg.out_dir}"
                )
    except ConfigError as e:
        distributed.teardown(clean_exit=False)
        parser.error(str(e))
    except NonFiniteLossError as e:
        distributed.teardown()  # every rank sees the same all-reduced loss, so all stop here
        print(str(e), file=sys.stderr)
        return 1
    except BaseException:
        distributed.teardown(clean_exit=False)
        raise
    distributed.teardown()
    return 0
