"""Training steps of real timm/torchvision models: stock vs swapped (fastops.swap_modules + FusedAdamW),
eager and torch.compile'd, channels_last, fp32 and bf16 autocast.

One timed call is one full optimizer step of fastops.train.train_step (zero_grad, forward,
cross-entropy, backward, grad-norm clipping, optimizer step), built by bench_train.training_step.
Models are created with random init (never downloaded weights), 1000 classes; the swapped model is
the stock one, same seed, after swap_modules. Providers, timed interleaved one step each per round:

* ``stock``: the model as its library builds it, torch.optim.AdamW (foreach, torch's default)
* ``fastops``: swap_modules(model) + fastops.optim.FusedAdamW
* ``stock_compile`` / ``fastops_compile``: the same with torch.compile(model) (--no-compile skips them)

Every provider's speedup is reported against stock eager. Without timm and torchvision the bench
prints why and exits 0 (a model of the library that is missing is skipped the same way).

    python -m benchmarks.bench_models [--device cpu|cuda] [--models ...] [--amp none bf16]
        [--batch-size N] [--image-size N] [--no-compile] [--check]
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from benchmarks import common
from benchmarks.bench_train import training_step

# name -> (library, the library's name for it). The first three are the headline set.
MODELS: dict[str, tuple[str, str]] = {
    "mobilenetv3_small_100": ("timm", "mobilenetv3_small_100"),
    "efficientnet_b0": ("timm", "efficientnet_b0"),
    "convnext_atto": ("timm", "convnext_atto"),
    "tf_efficientnet_b0": ("timm", "tf_efficientnet_b0"),
    "edgenext_xx_small": ("timm", "edgenext_xx_small"),
    "tv_mobilenet_v2": ("torchvision", "mobilenet_v2"),
    "tv_efficientnet_b0": ("torchvision", "efficientnet_b0"),
    "tv_convnext_tiny": ("torchvision", "convnext_tiny"),
}
DEFAULT_MODELS = ("mobilenetv3_small_100", "efficientnet_b0", "convnext_atto")
NUM_CLASSES = 1000
# (batch, image size) by device: a CPU step has to stay in the hundreds of ms.
DEFAULT_SHAPE = {"cpu": (16, 128), "cuda": (64, 224)}
AMP_DTYPES = {"none": torch.float32, "bf16": torch.bfloat16}
BASELINE = "stock"
CHECK_PAIRS = (("fastops", "stock"), ("fastops_compile", "stock_compile"))


def importable(library: str) -> bool:
    """Whether `library` imports (an installed torchvision built for another torch fails here too)."""
    try:
        importlib.import_module(library)
    except Exception:  # ImportError, or a torchvision whose C ops do not match this torch
        return False
    return True


def create_model(name: str) -> torch.nn.Module:
    """A fresh model `name` (a MODELS key), random init, NUM_CLASSES classes, seeded identically."""
    library, arch = MODELS[name]
    torch.manual_seed(0)
    if library == "timm":
        import timm

        return timm.create_model(arch, pretrained=False, num_classes=NUM_CLASSES)
    import torchvision

    return torchvision.models.get_model(arch, weights=None, num_classes=NUM_CLASSES)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models",
        nargs="+",
        choices=list(MODELS),
        default=list(DEFAULT_MODELS),
        help="tv_* are torchvision's; default: " + " ".join(DEFAULT_MODELS),
    )
    parser.add_argument("--amp", nargs="+", choices=list(AMP_DTYPES), default=list(AMP_DTYPES))
    parser.add_argument("--batch-size", type=int, default=0, help="0: 16 on the CPU, 64 on CUDA")
    parser.add_argument("--image-size", type=int, default=0, help="0: 128 on the CPU, 224 on CUDA")
    common.add_warm_cache_option(parser)


def shape(args: argparse.Namespace) -> tuple[int, int]:
    batch, image = DEFAULT_SHAPE[args.device]
    return args.batch_size or batch, args.image_size or image


# provider -> what fastops.tune measured for it, per model and dtype (the notes list them)
TUNING: list[str] = []


def cases(args: argparse.Namespace) -> Iterator[common.BenchCase]:
    batch, image = shape(args)
    # The first swapped model's tuning is the cold cost a new user pays once per machine; later ones
    # (the compiled provider) read what it measured.
    common.empty_kernel_choice_cache(args)
    modes = [False] if args.no_compile else [False, True]
    for name in args.models:
        library = MODELS[name][0]
        if not importable(library):
            print(f"bench_models: skipping {name}: {library} cannot be imported", flush=True)
            continue
        for amp_mode in args.amp:
            steps: dict[str, Callable[[], object]] = {}
            for compiled in modes:
                for fastops in (False, True):
                    provider = ("fastops" if fastops else "stock") + ("_compile" if compiled else "")
                    steps[provider] = training_step(
                        create_model(name),
                        fastops=fastops,
                        device=args.device,
                        compiled=compiled,
                        amp_mode=amp_mode,
                        memory_format=torch.channels_last,
                        batch_size=batch,
                        image_size=image,
                        num_classes=NUM_CLASSES,
                    )

            for provider, step in steps.items():
                table = getattr(step, "tuning", None)
                if table is not None:
                    chose_torch = sum(row.choice == "torch" for row in table.rows)
                    TUNING.append(
                        f"{name} {amp_mode} {provider}: {len(table.rows)} kernel choices, {table.measured} "
                        f"timed in {table.seconds:.1f} s, the rest from the cache; PyTorch's kernel for {chose_torch}"
                    )

            def rates(times: list[float], batch: int = batch) -> dict[str, float | str]:
                median = common.quantiles(times)[0]
                return {"steps_per_s": 1e3 / median, "samples_per_s": batch * 1e3 / median}

            yield common.BenchCase(
                name,
                "step",
                AMP_DTYPES[amp_mode],
                f"batch {batch} {image}px",
                steps,
                extra={"library": library, "memory_format": "channels_last"},
                derived=rates,
            )
            del steps


def add_speedups(results: list[common.Result]) -> list[common.Result]:
    """Adds each row's speedup over stock eager of its row group (column speedup_vs_stock)."""
    base = {(r.case, r.dtype, r.size): r.median_ms for r in results if r.provider == BASELINE}
    for r in results:
        stock = base.get((r.case, r.dtype, r.size))
        if stock is not None:
            r.extra["speedup_vs_stock"] = stock / r.median_ms
    return results


def speedup_table(results: Sequence[common.Result]) -> str:
    """Markdown: per model and dtype, each provider's ms/step, samples/s and speedup over stock eager."""
    providers = [
        p
        for p in ("stock", "fastops", "stock_compile", "fastops_compile")
        if any(r.provider == p for r in results)
    ]
    head = "| model | dtype | size | " + " | ".join(f"{p} ms (samples/s)" for p in providers)
    head += " | " + " | ".join(f"{p} vs stock" for p in providers if p != BASELINE)
    head += " | other jobs' cores |"
    lines = [head, "|" + "---|" * (3 + 2 * len(providers))]
    groups: dict[tuple[str, str, str], dict[str, common.Result]] = {}
    for r in results:
        groups.setdefault((r.case, r.dtype, r.size), {})[r.provider] = r
    for (case, dtype, size), rows in groups.items():
        cells = [
            f"{rows[p].median_ms:.1f} ({float(rows[p].extra['samples_per_s']):.1f})" if p in rows else "-"
            for p in providers
        ]
        speedups = [
            f"{float(rows[p].extra['speedup_vs_stock']):.2f}x"
            if p in rows and "speedup_vs_stock" in rows[p].extra
            else "-"
            for p in providers
            if p != BASELINE
        ]
        others = next(iter(rows.values())).extra.get("others_cores")
        busy = f"{float(others):.2f}" if others is not None else "-"
        lines.append(f"| {case} | {dtype} | {size} | " + " | ".join([*cells, *speedups, busy]) + " |")
    return "\n".join(lines)


def _load() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return None


def _cpu_seconds() -> tuple[float, float, float] | None:
    """(wall clock, busy CPU seconds of the whole machine from /proc/stat, CPU seconds of this
    process and its threads), or None off Linux."""
    try:
        import resource

        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (ImportError, OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user..steal; guest is within user
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return time.monotonic(), busy, usage.ru_utime + usage.ru_stime


def _others_cores(
    start: tuple[float, float, float] | None, end: tuple[float, float, float] | None
) -> float | None:
    """Cores other processes kept busy on average between two _cpu_seconds() readings."""
    if not start or not end or end[0] <= start[0]:
        return None
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0]))


class LoadRecorder:
    """What else ran on the machine while the cases were timed, for the notes: the load average
    (1/5/15 min) at the start and the end, and the cores other processes kept busy on average
    during the cases (the machine's busy CPU time from /proc/stat less this process's own). On a
    shared machine a competing job shows up here; the numbers are then comparable within a run only."""

    def __init__(self) -> None:
        self.before: tuple[float, float, float] | None = None
        self.after: tuple[float, float, float] | None = None
        self.others_cores: float | None = None
        self.per_case: dict[tuple[str, str, str], float | None] = {}

    def wrap(self, cases: Callable[[argparse.Namespace], Iterator[common.BenchCase]]):
        def wrapped(args: argparse.Namespace) -> Iterator[common.BenchCase]:
            self.before, start = _load(), _cpu_seconds()
            for case in cases(args):
                # The runner times the case between this yield and the next request.
                case_start = _cpu_seconds()
                key = (case.case, str(case.dtype).removeprefix("torch."), case.size)
                yield case
                self.per_case[key] = _others_cores(case_start, _cpu_seconds())
            self.after = _load()
            self.others_cores = _others_cores(start, _cpu_seconds())

        return wrapped

    def add_columns(self, results: list[common.Result]) -> list[common.Result]:
        """Column others_cores: the cores other processes kept busy while the row's case was timed."""
        for r in results:
            others = self.per_case.get((r.case, r.dtype, r.size))
            if others is not None:
                r.extra["others_cores"] = others
        return results

    def text(self, device: str) -> str:
        def fmt(load: tuple[float, float, float] | None) -> str:
            return " ".join(f"{x:.2f}" for x in load) if load else "unknown"

        text = (
            f"Load average (1/5/15 min) when the cases started: {fmt(self.before)}; when they "
            f"ended: {fmt(self.after)}"
        )
        if device != "cpu":
            return text + "."
        text += f" (on {os.cpu_count()} cores)."
        if self.others_cores is not None:
            text += (
                f" Other processes kept {self.others_cores:.2f} cores busy on average during the cases "
                "(per case: column others_cores of the CSV; it counts torch.compile's worker "
                "processes too, which compile during the compiled providers' warm-up)."
            )
            worst = max((v for v in self.per_case.values() if v is not None), default=0.0)
            if max(self.others_cores, worst) >= 0.25:
                # Seen on the 2-core machine: mobilenetv3_small_100 bf16 at batch 4 took 6.2 s a
                # step with 2 threads beside a busy job and 57 ms with 1 thread.
                text += (
                    " **Busy machine**: with as many torch threads as free cores or more, every "
                    "parallel region can wait for a descheduled thread, which costs most to the "
                    "provider that launches the most ops: compare rows within this run only."
                )
        return text


def notes_for(load: LoadRecorder) -> Callable[[argparse.Namespace, list[common.Result]], str]:
    def notes(args: argparse.Namespace, results: list[common.Result]) -> str:
        threads = torch.get_num_threads()
        return (
            "One timed call = one optimizer step of fastops.train.train_step (zero_grad, forward, "
            "cross-entropy, backward, grad-norm clip at 1.0, optimizer step) of a randomly initialized "
            "model, channels_last, 1000 classes. stock: the library's model + torch.optim.AdamW "
            "(foreach); fastops: fastops.swap_modules(model) + fastops.optim.FusedAdamW; *_compile: "
            "torch.compile(model) of each. bfloat16 rows: torch.autocast(device_type, "
            "dtype=torch.bfloat16) around forward and loss. Providers timed interleaved, one step of "
            "each per round, after warm-up; 'vs stock' = stock eager median / provider median.\n\n"
            f"torch threads: {threads}. "
            + load.text(args.device)
            + common.allocation_note(args)
            + "\n\n"
            + speedup_table(results)
            + "\n\nKernel choices (fastops.tune before timing"
            + (", warm cache" if args.warm_cache else ", from an empty cache")
            + "):\n\n"
            + "\n".join(f"- {line}" for line in TUNING)
            + "\n\nAll rows (the runner's table; its 'fastops speedup' column is relative to fastops eager):"
        )

    return notes


def summary(args: argparse.Namespace, results: list[common.Result]) -> str:
    return speedup_table(results)


def main(argv: Sequence[str] | None = None) -> None:
    if not (importable("timm") or importable("torchvision")):
        print(
            "bench_models: skipped: neither timm nor torchvision can be imported (pip install -r requirements-models.txt)"
        )
        return
    load = LoadRecorder()
    # Whole training steps of real models: at least 3 s of them per provider (1 s under --quick).
    common.run_benchmark(
        "models",
        load.wrap(cases),
        description=__doc__.splitlines()[0],
        options=options,
        notes=notes_for(load),
        summary=summary,
        finish=lambda rows: load.add_columns(add_speedups(rows)),
        check_pairs=CHECK_PAIRS,
        min_time=3.0,
        quick_min_time=1.0,
        argv=argv,
    )


if __name__ == "__main__":
    main()
