"""Command line of fastops.train: ``python -m fastops.train`` / ``fastops-train`` / under torchrun."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastops.train.config import NUMBERS, ConfigError, TrainConfig

DEFAULTS = TrainConfig()

# The parser's option groups: each starts at the named field and runs to the next one.
SECTIONS = {
    "model": "what to train",
    "epochs": "optimization",
    "device": "execution",
    "out_dir": "output",
}
# Defaults of the bundled job that depend on --data synthetic (throughput runs: ImageNet-sized
# images, a few epochs), applied when the option is not given.
SYNTHETIC_DEFAULTS = {"image_size": 224, "epochs": 3}


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return " ".join(map(str, value)) or "none"
    return str(value)


def _add_option(group: Any, f: dataclasses.Field) -> None:
    """The option of one TrainConfig field: a Number parses a numeric one (so a bad value is an
    argparse error naming the option, before anything is built, in the words TrainConfig.validate
    uses), a bool is --x/--no-x, a tuple takes one or more values. The default is the field's, shown
    once at the end of the help; options not given are absent from the namespace."""
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS}
    help_text = f.metadata["help"]
    spec = NUMBERS.get(f.name)
    if spec is not None:

        def parse(text: str, spec: Any = spec) -> int | float:
            try:
                return spec.parse(text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        kwargs.update(type=parse, metavar="N" if spec.kind is int else "X")
        help_text = f"{help_text}; {spec.describe()}"
    elif f.type in ("bool", "bool | None"):
        kwargs["action"] = argparse.BooleanOptionalAction
    elif f.type.startswith("tuple"):
        kwargs.update(nargs="+", type=str, metavar="NAME")
    elif f.type in ("Path", "Path | None"):
        kwargs.update(type=Path, metavar="PATH")
    elif not f.metadata.get("choices"):
        kwargs["metavar"] = _flag(f).removeprefix("--").upper()
    if f.metadata.get("choices"):
        kwargs["choices"] = f.metadata["choices"]
    if default is not None and not (f.type.startswith("bool") and "(default" in help_text):
        help_text = f"{help_text} (default: {_shown(default)})"
    group.add_argument(_flag(f), help=help_text, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastops-train",
        description=(
            "Train a model (the bundled convnet of fastops blocks, a timm or torchvision model, or "
            "your own) on scikit-learn's digits, synthetic images or an ImageFolder directory, with "
            "fastops modules and FusedAdamW. Multi-process: torchrun --standalone "
            "--nproc_per_node=N -m fastops.train [options]; add --fsdp to shard with FSDP2. "
            "Multi-node: torchrun --nnodes=N --nproc_per_node=G --rdzv-backend=c10d "
            "--rdzv-endpoint=HOST:PORT --rdzv-id=JOB -m fastops.train [options]."
        ),
    )
    mode = p.add_argument_group("what to run")
    which = mode.add_mutually_exclusive_group()
    which.add_argument(
        "--baseline",
        action="store_true",
        help="stock PyTorch modules and torch.optim.AdamW instead of fastops (same as --no-fastops)",
    )
    which.add_argument(
        "--compare",
        action="store_true",
        help="run fastops and the baseline, print a table and write compare.png into --out-dir",
    )
    group = None
    for f in dataclasses.fields(TrainConfig):
        if f.name in SECTIONS:
            group = p.add_argument_group(SECTIONS[f.name])
        _add_option(group, f)
    return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if hasattr(args, f.name)}
    if given.get("dataset") == "synthetic":
        given = {**SYNTHETIC_DEFAULTS, **given}
    if args.baseline:
        given["fastops"] = False
    if "blocks" in given:
        given["blocks"] = tuple(given["blocks"])
    return TrainConfig(**given)


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
    busy = busy_machine_note(results)
    if busy:
        rows.append(busy)
    return "\n".join(rows)


def busy_machine_note(results: dict[str, dict[str, Any]], cpus: int | None = None) -> str | None:
    """A warning when another job loaded the CPUs while the legs ran, else None.

    The legs run one after the other, so a job that overlaps only one of them skews the ratio (seen:
    0.35x with a competing job during the fastops leg, 1.05x on the quiet machine just after; both
    legs' kernels degrade alike under the same load). Each leg records the 1-minute load average
    before and after it runs (``load_avg``); a leg itself adds at most its own threads.
    """
    cpus = cpus or os.cpu_count() or 1
    loads = {name: s["load_avg"] for name, s in results.items() if s.get("load_avg")}
    if not loads:
        return None
    peak = max(max(pair) for pair in loads.values())
    if peak <= cpus + 0.5:
        return None
    spans = ", ".join(f"{name} {a:.1f} -> {b:.1f}" for name, (a, b) in loads.items())
    return (
        f"\nnote: the machine was busy (1-min load average {spans}, on {cpus} CPUs); the legs ran one "
        "after the other, so their throughputs are not comparable. Rerun on a quiet machine."
    )


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


def _load_average() -> float | None:
    """The 1-minute load average, where the OS has one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def run_compare(cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Train the fastops and the stock model with the same settings and seed; table + bar chart.

    Single process: each leg runs in its own spawned process (clean peak-memory numbers). Under
    torchrun the legs run one after the other in the ranks' processes; CUDA peak memory is reset
    per leg, CPU peak RSS is then the maximum over the legs so far.
    """
    from fastops.train import distributed, extras
    from fastops.train.metrics import write_json
    from fastops.train.plots import plot_compare
    from fastops.train.trainer import Trainer

    info = distributed.setup(cfg.resolved_device())
    results: dict[str, dict[str, Any]] = {}
    for name, use_fastops in (("fastops", True), ("stock", False)):
        sub = cfg.replace(fastops=use_fastops, out_dir=Path(cfg.out_dir) / name)
        load_before = _load_average()
        results[name] = Trainer.from_config(sub).fit() if info.enabled else _fit_isolated(sub)
        if load_before is not None:
            results[name]["load_avg"] = (load_before, _load_average() or load_before)
    if info.is_main:
        table = compare_table(results)
        print(table)
        (Path(cfg.out_dir) / "compare.md").write_text(table + "\n")
        write_json(Path(cfg.out_dir) / "compare.json", results)
        if extras.optional("matplotlib", "no compare.png is drawn", "matplotlib"):
            plot_compare(results, Path(cfg.out_dir) / "compare.png")
            print(f"wrote {Path(cfg.out_dir) / 'compare.png'}")
    distributed.barrier(info)
    return results


def _train(cfg: TrainConfig) -> None:
    from fastops.train.trainer import Trainer

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # --model package.module:factory imports the user's code from the working directory, as
    # ``python -m`` would; the fastops-train script does not put it on sys.path by itself.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        cfg = config_from_args(args).validate()
    except ConfigError as e:
        parser.error(str(e))  # exits with status 2 and the usage line

    from fastops.train import distributed
    from fastops.train.trainer import NonFiniteLossError

    try:
        if args.compare:
            run_compare(cfg)
        else:
            _train(cfg)  # returns with the trainer and its DDP model gone, before the teardown
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
