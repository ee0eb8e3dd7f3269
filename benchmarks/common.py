"""Shared benchmark harness: one runner, timing, a copy roofline, environment capture and result files.

A bench_<op>.py declares its cases and hands them to `run_benchmark`: a generator of `BenchCase`s
(one case, direction, dtype and size each, with the op's byte and FLOP counts and a callable per
provider), plus optionally its own command-line options, notes and summary. The runner does the
rest: arguments, CPU allocation fairness, the copy roofline, timing every case with its providers
interleaved, the Result rows, the printed markdown table, and one CSV file for the run in the long
format of benchmarks/results/data (COLUMNS: a row per case and provider, with the machine, versions,
git sha and dirty flag, date and tag on every row); `python -m benchmarks.render_readme` turns the
data into the per-op pages and the README table.

Timings are medians with p20/p80 over repetitions after warm-up; GPU times come from CUDA events.
On a CPU shared with other jobs, `--thread-time` (with `--threads 1`) times each call in the calling
thread's CPU time instead of wall-clock time: a call that the scheduler parks for a 10-20 ms slice
then costs what it computed, not what it waited (our kernels and oneDNN both run in the calling
thread at one thread, so nothing is left out).
Achieved bandwidth is the op's minimal byte count (each input read once, each output written once)
divided by the median time, and is shown against the copy bandwidth measured in the same run
(`copy_roofline_gbps`); a case that counts FLOPs also gets TFLOP/s (column tflops).

Allocation effects on the CPU: glibc hands allocations above its mmap threshold (32 MiB here, after
its dynamic adjustment) straight to the kernel, so every fresh large output page-faults on first
touch and a benchmark then measures the page-fault handler. `fair_cpu_allocation()` raises the
thresholds so freed blocks are reused, and faults in a large heap once up front, for every provider
alike (torch's CPU allocator sits on malloc); pass --fresh-pages to measure with first-touch faults
instead.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import datetime as _dt
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DATA_DIR = RESULTS_DIR / "data"
REPO_ROOT = Path(__file__).resolve().parent.parent


def base_parser(description: str, devices: Sequence[str] = ("cpu", "cuda")) -> argparse.ArgumentParser:
    """The options every benchmark takes; `devices` are the ones its op has kernels for."""
    parser = argparse.ArgumentParser(description=description)
    default_device = "cuda" if torch.cuda.is_available() and "cuda" in devices else devices[0]
    parser.add_argument("--device", default=default_device, choices=["cpu", "cuda"])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repetitions (smoke run)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    parser.add_argument(
        "--fresh-pages", action="store_true", help="CPU: keep glibc's mmap threshold (page faults)"
    )
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of timed repetitions per case")
    parser.add_argument(
        "--out", type=Path, default=DATA_DIR, help="data directory: the run's CSV goes to <out>/<op>/"
    )
    parser.add_argument(
        "--tag",
        default="",
        help="a variant that covers other cases than the full run (bf16, cl): kept apart when rendering",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="CPU: torch.set_num_threads (0: torch's default)"
    )
    parser.add_argument(
        "--thread-time",
        action="store_true",
        help="CPU, with --threads 1: time calls in the calling thread's CPU time (time.thread_time), "
        "not wall-clock time, so time spent descheduled by other jobs on a shared machine is not counted",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit with status 1 when a fastops path is slower than its baseline (below 1.0x eager); "
        "a developer's regression check, not a CI gate (shared machines are noisy)",
    )
    return parser


# (ours, baseline) provider pairs that --check compares by default; a bench whose providers are
# named otherwise (the fused Adam step against torch's fused one) passes its own.
DEFAULT_CHECK_PAIRS: tuple[tuple[str, str], ...] = (("fastops", "eager"),)


@dataclass
class CheckFailure:
    """A row group where provider `ours` is slower than `baseline` (speedup < 1)."""

    group: tuple[str, str, str, str]  # case, direction, dtype, size
    ours: str
    baseline: str
    speedup: float  # baseline median / ours median

    def __str__(self) -> str:
        case, direction, dtype, size = self.group
        return f"{case} {direction} {dtype} {size}: {self.ours} {self.speedup:.2f}x {self.baseline}"


def check_speedups(
    results: Sequence[Result], pairs: Sequence[tuple[str, str]] = DEFAULT_CHECK_PAIRS, minimum: float = 1.0
) -> list[CheckFailure]:
    """Every row group in which a pair's `ours` provider runs at less than `minimum` x the median
    speed of its `baseline` (both must have been timed in that group)."""
    groups: dict[tuple[str, str, str, str], dict[str, Result]] = {}
    for r in results:
        groups.setdefault((r.case, r.direction, r.dtype, r.size), {})[r.provider] = r
    failures = []
    for key, rows in groups.items():
        for ours, baseline in pairs:
            if ours in rows and baseline in rows:
                speedup = rows[baseline].median_ms / rows[ours].median_ms
                if speedup < minimum:
                    failures.append(CheckFailure(key, ours, baseline, speedup))
    return failures


def empty_kernel_choice_cache(args: argparse.Namespace) -> None:
    """Unless ``--warm-cache``, point fastops' kernel-choice cache at a new empty directory, so that a
    run measures every choice itself (and reports what that cost) instead of reusing an earlier run's."""
    if not getattr(args, "warm_cache", False):
        os.environ["FASTOPS_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastops-bench-cache-")


def add_warm_cache_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--warm-cache",
        action="store_true",
        help="use the kernel-choice cache as it is (default: an empty one, so every choice is measured "
        "in this run and its cost reported)",
    )


def fair_cpu_allocation() -> bool:
    """Let glibc reuse freed large blocks instead of unmapping them (see the module docstring)."""
    if platform.system() != "Linux":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # mallopt's mmap threshold is capped at 32 MiB, so switch mmap off (M_MMAP_MAX = 0) and never
    # trim: large blocks then come from the heap and are reused after free, with no first-touch faults.
    m_trim_threshold, m_mmap_max = -1, -4
    ok = libc.mallopt(m_mmap_max, ctypes.c_int(0)) == 1
    ok = libc.mallopt(m_trim_threshold, ctypes.c_int(2**31 - 1)) == 1 and ok
    if ok:
        _prefault_heap(libc, PREFAULT_BYTES)
    return ok


# The biggest working set of the elementwise benchmarks (a 64M-element fp32 forward + backward with
# eager's intermediates is ~1.5 GiB), and below the 2 GiB trim threshold (free would give it back).
PREFAULT_BYTES = 15 << 27


def _prefault_heap(libc: ctypes.CDLL, nbytes: int) -> None:
    """Grow the heap once by nbytes, touch every page and free it again. Without this, whichever
    provider runs first pays for faulting in the heap as it grows (seen: the first provider's
    64M-element fwd+bwd took 600 ms where steady state is 83 ms, 65,536 faults per call), and the
    allocation order of each provider decides which of its blocks land on fresh pages."""
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(ctypes.c_size_t(nbytes))
    if not block:
        return
    ctypes.memset(block, 0, nbytes)
    libc.free(block)


# The CPU clock of time_ms: wall-clock, or the thread's CPU time under --thread-time.
_CPU_CLOCK: list[Callable[[], float]] = [time.perf_counter]


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_ms(
    fn: Callable[[], object],
    device: str,
    min_time: float = 1.0,
    warmup: int = 3,
    max_reps: int = 1000,
    min_reps: int = 5,
) -> list[float]:
    """Per-call times in ms of fn() after warm-up: CUDA events on the GPU, perf_counter (or, under
    --thread-time, the thread's CPU time) on the CPU."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times: list[float] = []
    start_wall = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start_wall < min_time):
        if device == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end))
        else:
            clock = _CPU_CLOCK[0]
            t0 = clock()
            fn()
            times.append((clock() - t0) * 1e3)
    return times


def quantiles(times: Sequence[float]) -> tuple[float, float, float]:
    """(median, p20, p80) of a list of times."""
    ordered = sorted(times)
    if len(ordered) == 1:
        return ordered[0], ordered[0], ordered[0]
    q = statistics.quantiles(ordered, n=10, method="inclusive")
    return statistics.median(ordered), q[1], q[7]


def copy_roofline_gbps(device: str, nbytes: int | None = None, min_time: float = 1.0) -> float:
    """Bandwidth of dst.copy_(src) in GB/s, counting bytes read plus bytes written."""
    if nbytes is None:
        nbytes = (1 << 30) if device == "cuda" else (256 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    median, _, _ = quantiles(time_ms(lambda: dst.copy_(src), device, min_time=min_time))
    return 2 * nbytes / (median * 1e-3) / 1e9


@dataclass
class Result:
    op: str
    case: str
    direction: str
    dtype: str
    size: str
    provider: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    bytes: int
    gbps: float
    roofline_pct: float
    extra: dict[str, float | str] = field(default_factory=dict)


def result_from_times(
    op: str,
    case: str,
    direction: str,
    dtype: torch.dtype,
    size: str,
    provider: str,
    times: Sequence[float],
    nbytes: int,
    roofline: float,
    **extra: float | str,
) -> Result:
    """The Result row of one provider from its per-call times in ms."""
    median, p20, p80 = quantiles(times)
    gbps = nbytes / (median * 1e-3) / 1e9 if nbytes else 0.0
    return Result(
        op,
        case,
        direction,
        str(dtype).removeprefix("torch."),
        size,
        provider,
        median,
        p20,
        p80,
        nbytes,
        gbps,
        100 * gbps / roofline if roofline else 0.0,
        dict(extra),
    )


def interleaved_times(
    fns: dict[str, Callable[[], object]],
    device: str,
    min_time: float,
    *,
    warmup: int,
    min_reps: int,
    max_reps: int,
) -> dict[str, list[float]]:
    """Per-call times in ms of every provider, taken in rounds (one call of each provider per round),
    so load from other jobs on a shared machine falls on all providers alike instead of on whichever
    happened to run during a busy second. Runs at least min_reps rounds, then until min_time seconds
    per provider have passed, at most max_reps rounds. The order rotates from round to round."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns.items())
    start = time.perf_counter()
    rounds = 0
    while rounds < max_reps and (rounds < min_reps or time.perf_counter() - start < min_time * len(fns)):
        # Each round starts with the next provider, so none always runs first (on caches and
        # clocks left by another) or always right after the same one.
        for name, fn in order[rounds % len(order) :] + order[: rounds % len(order)]:
            times[name] += time_ms(fn, device, min_time=0.0, warmup=0, max_reps=1, min_reps=1)
        rounds += 1
    return times


def _git_state() -> tuple[str, bool]:
    """(short sha of HEAD, whether tracked files differ from it). Without .git (a copy on the GPU
    machine) the caller passes FASTOPS_GIT_SHA along, "<sha>+dirty" for a dirty tree; an unknown
    sha counts as dirty, since nothing shows the run came from a commit."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha, changed = "", ""
    if not sha:
        sha = os.environ.get("FASTOPS_GIT_SHA", "unknown")
        changed = "+dirty" if sha.endswith("+dirty") else ""
        sha = sha.removesuffix("+dirty")
    return sha, bool(changed) or sha == "unknown"


def machine_tag(facts: dict[str, str]) -> str:
    """The machine a run stands for, as a file-name-safe word: the CPU model with the fastops ISA
    level and thread count (the AVX2 level forced on an AVX-512 host is another machine), or the GPU name."""
    name = re.sub(r"\((r|tm)\)|\bcpu\b|@.*", " ", facts["machine"].lower())
    tag = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown"
    if facts["device"] == "cpu":
        tag += f"-{facts['isa']}-t{facts['threads']}"
    return tag


def _script() -> str:
    """How the running script was named: ``-m <module>``, or its path (from the repo root if inside)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return f"-m {spec.name}"
    path = Path(sys.argv[0]).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else sys.argv[0]


def environment(device: str) -> dict[str, str]:
    """The facts of a run, repeated on every row it writes: device, machine, versions, git state,
    date (UTC), clock and command."""
    import fastops
    from fastops import _extension

    ext = _extension.load()
    if device == "cuda":
        machine = torch.cuda.get_device_name()
        major, minor = torch.cuda.get_device_capability()
        isa, threads, cores = f"sm_{major}{minor}", "", ""
    else:
        machine = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                machine = next(
                    (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), machine
                )
        except OSError:
            pass
        isa, threads, cores = ext.cpu_capability, str(torch.get_num_threads()), str(os.cpu_count())
    sha, dirty = _git_state()
    facts = {
        "device": device,
        "machine": machine,
        "isa": isa,
        "threads": threads,
        "cores": cores,
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "python": platform.python_version(),
        "fastops": fastops.__version__,
        "build": ext.mode,
        "git_sha": sha,
        "dirty": str(dirty).lower(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "clock": "thread CPU time" if _CPU_CLOCK[0] is time.thread_time else "wall clock",
        "command": " ".join([Path(sys.executable).name, _script(), *sys.argv[1:]]),
    }
    facts["machine_tag"] = machine_tag(facts)
    return facts


# The long format of benchmarks/results/data/<op>/*.csv: one row per case and provider, the run's facts
# (from environment(), plus copy roofline and tag) repeated on every row so that any set of files
# concatenates into one table. layout, shape and tflops are empty where a benchmark has none; speedup
# is the benchmark's own (an extra named speedup_vs_<provider>: speedup_over names the provider);
# extra holds the benchmark's other columns as JSON (samples_per_s, reps, ...).
COLUMNS = (
    "op",
    "case",
    "direction",
    "dtype",
    "layout",
    "shape",
    "size",
    "provider",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "bytes",
    "gbps",
    "roofline_gbps",
    "roofline_pct",
    "tflops",
    "speedup",
    "speedup_over",
    "device",
    "machine",
    "isa",
    "threads",
    "cores",
    "machine_tag",
    "torch",
    "cuda",
    "python",
    "fastops",
    "build",
    "git_sha",
    "dirty",
    "date",
    "clock",
    "tag",
    "command",
    "extra",
)


def long_rows(
    results: Sequence[Result], facts: dict[str, str], roofline: float, tag: str = ""
) -> list[dict[str, str]]:
    """The rows of one run in the long format (COLUMNS)."""
    rows = []
    for r in results:
        extra = dict(r.extra)
        speedups = {k: extra.pop(k) for k in list(extra) if k.startswith("speedup_vs_")}
        speedup_over, speedup = next(iter(speedups.items()), ("", ""))
        row = {
            **facts,
            "op": r.op,
            "case": r.case,
            "direction": r.direction,
            "dtype": r.dtype,
            "layout": str(extra.pop("layout", "")),
            "shape": str(extra.pop("shape", "")),
            "size": r.size,
            "provider": r.provider,
            "median_ms": f"{r.median_ms:.6g}",
            "p20_ms": f"{r.p20_ms:.6g}",
            "p80_ms": f"{r.p80_ms:.6g}",
            "bytes": str(r.bytes),
            "gbps": f"{r.gbps:.4g}",
            "roofline_gbps": f"{roofline:.1f}",
            "roofline_pct": f"{r.roofline_pct:.3g}",
            "tflops": _cell(extra.pop("tflops", "")),
            "speedup": _cell(speedup),
            "speedup_over": speedup_over.removeprefix("speedup_vs_"),
            "tag": tag,
            "extra": json.dumps({k: extra[k] for k in sorted(extra)}) if extra else "",
        }
        rows.append({k: row[k] for k in COLUMNS})
    return rows


def _cell(value: float | str) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def result_from_row(row: dict[str, str]) -> Result:
    """A Result back from a long-format row (layout, shape, tflops and the bench's speedup in extra)."""
    extra: dict[str, float | str] = json.loads(row["extra"]) if row.get("extra") else {}
    for key in ("layout", "shape", "tflops"):
        if row.get(key):
            extra[key] = float(row[key]) if key == "tflops" else row[key]
    if row.get("speedup"):
        extra[f"speedup_vs_{row['speedup_over']}"] = float(row["speedup"])
    return Result(
        row["op"],
        row["case"],
        row["direction"],
        row["dtype"],
        row["size"],
        row["provider"],
        float(row["median_ms"]),
        float(row["p20_ms"]),
        float(row["p80_ms"]),
        int(row["bytes"]),
        float(row["gbps"]),
        float(row["roofline_pct"]),
        extra,
    )


def run_file_name(facts: dict[str, str], tag: str = "") -> str:
    """<UTC date-time>_<machine tag>_<sha>[-dirty][_<tag>].csv: one file per run, so runs on
    parallel branches never touch the same file."""
    stamp = facts["date"].replace("-", "").replace(":", "")
    sha = facts["git_sha"] + ("-dirty" if facts["dirty"] == "true" else "")
    return f"{stamp}_{facts['machine_tag']}_{sha}" + (f"_{tag}" if tag else "") + ".csv"


def write_rows(path: Path, rows: Sequence[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def format_table(results: Sequence[Result], roofline: float) -> str:
    """Markdown table; speedup columns compare each provider with fastops in the same row group."""
    layouts = any(r.extra.get("layout") for r in results)
    flops = any("tflops" in r.extra for r in results)
    lines = [
        f"copy roofline: {roofline:.1f} GB/s (read + write)",
        "",
        "| case | dir | dtype | "
        + ("layout | " if layouts else "")
        + "size | provider | median ms | p20 | p80 | GB/s | % roofline | "
        + ("TFLOP/s | " if flops else "")
        + "fastops speedup |",
        "|---|---|---|"
        + ("---|" if layouts else "")
        + "---|---|---|---|---|---|---|"
        + ("---|" if flops else "")
        + "---|",
    ]
    groups: dict[tuple[str, str, str, str, str], dict[str, Result]] = {}

    def key(r: Result) -> tuple[str, str, str, str, str]:
        return (r.case, r.direction, r.dtype, str(r.extra.get("layout", "")), r.size)

    for r in results:
        groups.setdefault(key(r), {})[r.provider] = r
    for r in results:
        ours = groups[key(r)].get("fastops")
        speedup = f"{r.median_ms / ours.median_ms:.2f}x" if ours and r.provider != "fastops" else ""
        lines.append(
            f"| {r.case} | {r.direction} | {r.dtype} | "
            + (f"{r.extra.get('layout', '')} | " if layouts else "")
            + f"{r.size} | {r.provider} | {r.median_ms:.4f} | {r.p20_ms:.4f} | {r.p80_ms:.4f} | "
            f"{r.gbps:.1f} | {r.roofline_pct:.0f}% | "
            + (f"{float(r.extra['tflops']):.3f} | " if "tflops" in r.extra else ("| " if flops else ""))
            + f"{speedup} |"
        )
    return "\n".join(lines)


def write_results(
    op: str,
    device: str,
    results: Sequence[Result],
    roofline: float,
    out_dir: Path,
    tag: str = "",
) -> Path:
    """Writes the run's rows to out_dir/<op>/<run_file_name>.csv (the long format, COLUMNS)."""
    facts = environment(device)
    path = out_dir / op / run_file_name(facts, tag)
    write_rows(path, long_rows(results, facts, roofline, tag))
    return path


def compiled(fn: Callable) -> Callable:
    """The "compile" provider of fn: torch.compile, default mode, static shapes (compiles on first call)."""
    return torch.compile(fn, dynamic=False)


def same_size_copy(x: torch.Tensor) -> Callable[[], object]:
    """The "copy" provider of an elementwise forward: x copied into a preallocated tensor of its size,
    the forward's bytes with no math: the bandwidth this size reaches on this device, beside the
    copy roofline measured on a large buffer (a 67 MB copy on the H200 stays well below it)."""
    out = torch.empty_like(x)
    return lambda: out.copy_(x)


def module_grad_steps(
    modules: dict[str, torch.nn.Module], x: torch.Tensor, g: torch.Tensor
) -> dict[str, Callable[[], object]]:
    """One forward + backward per module: the gradients of its own copy of x and of its parameters
    for the upstream gradient g (torch.autograd.grad, so nothing accumulates between calls)."""

    def step(m: torch.nn.Module, xi: torch.Tensor) -> Callable[[], object]:
        return lambda: torch.autograd.grad(m(xi), [xi, *m.parameters()], g)

    return {k: step(m, x.detach().clone().requires_grad_(True)) for k, m in modules.items()}


def human_size(n: int) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def allocation_note(args: argparse.Namespace) -> str:
    """The sentence a CPU run's notes carry about its allocations (empty on the GPU)."""
    if args.device != "cpu":
        return ""
    how = "fresh pages (glibc default)" if args.fresh_pages else "glibc mmap disabled, freed blocks reused"
    return f" CPU allocations: {how}"


def select_shapes(shapes: Sequence[tuple], names: str, quick: Sequence[str] | None = None) -> list[tuple]:
    """The shapes (tuples whose first item is the case name) that --shapes names, else the quick set
    under --quick, else all."""
    wanted = set(names.split(",")) if names else (set(quick) if quick else None)
    return [s for s in shapes if s[0] in wanted] if wanted else list(shapes)


@dataclass
class BenchCase:
    """One row group: a case at one direction, dtype and size, timed for every provider.

    providers maps a provider name to a no-argument callable running the timed work once; a
    provider named "compile" is left out under --no-compile. nbytes is the op's minimal byte count
    (GB/s and % roofline; 0 where bandwidth means nothing); flops > 0 adds a tflops column. grad=False
    times under torch.no_grad() (forward-only passes and explicit backward kernels). extra holds
    constant CSV columns of every row; derived(times) columns computed from a provider's per-call
    times in ms.
    """

    case: str
    direction: str
    dtype: torch.dtype
    size: str
    providers: dict[str, Callable[[], object]]
    nbytes: int = 0
    flops: int = 0
    grad: bool = True
    extra: dict[str, float | str] = field(default_factory=dict)
    derived: Callable[[list[float]], dict[str, float | str]] | None = None


def run_benchmark(
    op: str,
    cases: Callable[[argparse.Namespace], Iterable[BenchCase]],
    *,
    description: str,
    options: Callable[[argparse.ArgumentParser], None] | None = None,
    notes: Callable[[argparse.Namespace, list[Result]], str] | None = None,
    summary: Callable[[argparse.Namespace, list[Result]], str] | None = None,
    finish: Callable[[list[Result]], list[Result]] | None = None,
    devices: Sequence[str] = ("cpu", "cuda"),
    check_pairs: Sequence[tuple[str, str]] = DEFAULT_CHECK_PAIRS,
    check_minimum: float = 1.0,
    min_time: float = 1.0,
    quick_min_time: float = 0.3,
    warmup: int = 3,
    min_reps: int = 5,
    max_reps: int = 1000,
    argv: Sequence[str] | None = None,
) -> list[Result]:
    """Parses the command line, times every case that cases(args) yields and writes the run's CSV.

    cases is a generator over the parsed arguments (args.device, args.quick and the bench's own
    options): it allocates a case's tensors just before yielding it and drops them once the cases
    that use them are done, so the inputs of one size at a time are alive. options adds the bench's own arguments to the parser;
    min_time is the default of --min-time, and --quick caps it at quick_min_time. Each case times
    its providers interleaved, call by call (interleaved_times with warmup / min_reps / max_reps).
    finish may rewrite the rows before they are printed and written; notes(args, rows) is printed
    before the table; summary(args, rows), when given, is printed at the end instead of the full
    table. A cases generator that yields nothing (a mode that prints instead, e.g. a profile) ends
    the run before the roofline is measured, and nothing is written. Under --check, the run then
    lists every row group where a check_pairs (ours, baseline) pair has ours below check_minimum x
    and exits with status 1 if there is one. Returns the rows.
    """
    parser = base_parser(description, devices)
    if options is not None:
        options(parser)
    parser.set_defaults(min_time=min_time)
    args = parser.parse_args(argv)
    if args.device not in devices:
        # Running on another device instead would record its numbers under this device's name.
        parser.error(
            f"--device {args.device}: {op} has a {'/'.join(d.upper() for d in devices)} kernel only "
            f"(no {args.device.upper()} benchmark)"
        )
    device = args.device
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.thread_time:
        if device != "cpu" or torch.get_num_threads() != 1:
            parser.error(
                "--thread-time: CPU with --threads 1 only (other threads' work would not be counted)"
            )
        _CPU_CLOCK[0] = time.thread_time
    if device == "cpu" and not args.fresh_pages:
        fair_cpu_allocation()
    seconds = min(quick_min_time, args.min_time) if args.quick else args.min_time
    # A compiled provider sees every size x dtype x grad mode of its op: let it keep them all. Past
    # the default 8 recompiles dynamo silently runs eager, and "compile" would time eager.
    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 16384

    def timed(
        source: Iterable[BenchCase], wanted: Callable[[BenchCase], bool], seconds: float, roofline: float
    ) -> Iterator[list[Result]]:
        """Each wanted case of source with its providers timed interleaved, case by case."""
        for case in source:
            if not wanted(case):
                continue
            providers = {
                name: fn for name, fn in case.providers.items() if not (name == "compile" and args.no_compile)
            }
            with torch.set_grad_enabled(case.grad):
                times = interleaved_times(
                    providers, device, seconds, warmup=warmup, min_reps=min_reps, max_reps=max_reps
                )
            group = [_result(op, case, name, ts, roofline) for name, ts in times.items()]
            _print_group(group)
            # Drop this case's tensors before the generator allocates the next one's.
            del case, providers, times
            yield group

    pending = iter(cases(args))
    first = next(pending, None)
    if first is None:
        return []
    roofline = copy_roofline_gbps(device, min_time=seconds)
    print(f"copy roofline on {device}: {roofline:.1f} GB/s", flush=True)
    every_case = itertools.chain([first], pending)
    del first  # (the chain holds it until it is timed, then lets it go)
    results = [r for group in timed(every_case, lambda case: True, seconds, roofline) for r in group]

    if finish is not None:
        results = finish(results)
    if notes is not None:
        print(notes(args, results))
    print(summary(args, results) if summary is not None else format_table(results, roofline))
    print(f"wrote {write_results(op, device, results, roofline, args.out, args.tag)}")
    if args.check:
        failures = check_speedups(results, check_pairs, check_minimum)
        pairs = ", ".join(f"{ours} vs {baseline}" for ours, baseline in check_pairs)
        if failures:
            # A row group whose providers are within noise of each other falls below the line now
            # and then on a shared machine: time the suspects again, three times as long, and judge
            # those groups by the second timing (both are printed; the data file keeps the first).
            suspects = {failure.group for failure in failures}
            print(f"check: {len(suspects)} row group(s) below {check_minimum:.2f}x, timing them again:")
            again = [
                r
                for group in timed(
                    cases(args), lambda case: _group_key(case) in suspects, 3 * seconds, roofline
                )
                for r in group
            ]
            failures = check_speedups(again, check_pairs, check_minimum)
        if failures:
            print(f"check FAILED ({pairs}): {len(failures)} row group(s) below {check_minimum:.2f}x:")
            for failure in failures:
                print(f"  {failure}")
            sys.exit(1)
        print(f"check passed ({pairs}): no row group below {check_minimum:.2f}x")
    return results


def _group_key(case: BenchCase) -> tuple[str, str, str, str]:
    """The (case, direction, dtype, size) of a case's row group, as check_speedups groups results."""
    return (case.case, case.direction, str(case.dtype).removeprefix("torch."), case.size)


def _result(op: str, case: BenchCase, provider: str, times: list[float], roofline: float) -> Result:
    extra = dict(case.extra)
    if case.derived is not None:
        extra.update(case.derived(times))
    r = result_from_times(
        op, case.case, case.direction, case.dtype, case.size, provider, times, case.nbytes, roofline, **extra
    )
    if case.flops:
        r.extra["tflops"] = case.flops / (r.median_ms * 1e-3) / 1e12
    return r


def _print_group(group: Sequence[Result]) -> None:
    """One line per provider, with its time as a multiple of the first provider's (ours)."""
    first = group[0]
    for r in group:
        line = (
            f"{r.case:24s} {r.direction:7s} {r.dtype:8s} {r.size:>14s} {r.provider:13s} {r.median_ms:10.4f} ms "
            f"[{r.p20_ms:.4f}, {r.p80_ms:.4f}]"
        )
        if r.bytes:
            line += f" {r.gbps:7.1f} GB/s"
        if "tflops" in r.extra:
            line += f" {float(r.extra['tflops']):.3f} TFLOP/s"
        if r is not first:
            line += f"  {r.median_ms / first.median_ms:.2f}x {first.provider}'s time"
        print(line, flush=True)
