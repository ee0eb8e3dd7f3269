"""Renders the benchmark data into pages: one page per op and the README's table (never typed by hand).

    python -m benchmarks.render_readme

Reads every run file under benchmarks/results/data/<op>/ (one CSV per run, the long format of
common.COLUMNS) and chooses by the data alone: per op, machine and tag, the newest run measured from a
committed tree. A run from a dirty tree (or an unknown commit) is never chosen, however new. Writes

- benchmarks/results/<op>.md: per machine, the chosen run's facts (date, git sha, versions, command)
  and its full table;
- README.md, between the bench-summary markers: a row per HEADLINES entry, a column per machine, each
  cell the geometric-mean speedup of fastops over eager (stock for training steps, torch's fused AdamW
  for the optimizer) and over torch.compile where the run timed it, linking to the op's page;
- benchmarks/results/README.md, between the same markers: the index of op pages and machines.

tests/benchmarks/test_render_readme.py fails when a page or the README differs from what the data
renders to, so commit a run's CSV together with the pages rendered from it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import common

RESULTS = common.RESULTS_DIR
DATA = common.DATA_DIR
README = common.REPO_ROOT / "README.md"
INDEX = RESULTS / "README.md"
START, END = "<!-- bench-summary:start -->", "<!-- bench-summary:end -->"


@dataclass(frozen=True)
class Headline:
    """A row of the README table: the rows of `ops`' chosen runs (only `cases` and `directions`
    when given), one cell per machine."""

    what: str
    ops: tuple[str, ...]
    cases: tuple[str, ...] = ()
    directions: tuple[str, ...] = ()
    note: str = ""


# Which cases stand for each op in the README; the runs behind them are chosen from the data.
HEADLINES = (
    Headline("clipped_log", ("clipped_log",)),
    Headline("gelu, erf form", ("gelu",), cases=("erf",)),
    Headline("bias_gelu, erf form", ("gelu",), cases=("bias_gelu_erf",)),
    Headline("FusedAdamW step (vs torch's fused AdamW)", ("fused_adam",)),
    Headline("depthwise_conv2d", ("depthwise_conv2d",)),
    Headline(
        "depthwise + 1x1, fused forward",
        ("depthwise_separable_conv2d",),
        directions=("fwd",),
        note="inference only; below 1.0x the module measures and runs the pair",
    ),
    Headline("squeeze_excite", ("squeeze_excite",)),
    Headline("batch_norm", ("batch_norm",)),
    Headline("training step, timm models (swapped + FusedAdamW vs stock)", ("models", "train")),
)


@dataclass(frozen=True)
class Run:
    """One run file: its rows, and the facts every row repeats."""

    path: Path
    rows: tuple[dict[str, str], ...]

    def fact(self, key: str) -> str:
        return self.rows[0].get(key, "")

    @property
    def op(self) -> str:
        return self.fact("op")

    @property
    def machine(self) -> str:
        return self.fact("machine_tag")

    @property
    def clean(self) -> bool:
        return self.fact("dirty") == "false" and self.fact("git_sha") not in ("", "unknown")

    def key(self) -> tuple[str, str]:
        """Newest first: the date, then the file name (same minute)."""
        return self.fact("date"), self.path.name


def load_runs(data: Path = DATA) -> list[Run]:
    runs = []
    for path in sorted(data.glob("*/*.csv")):
        with path.open(newline="") as f:
            rows = tuple(csv.DictReader(f))
        if rows:
            runs.append(Run(path, rows))
    return runs


def choose(runs: Iterable[Run]) -> list[Run]:
    """Per op, machine and tag, the newest clean run; dirty runs never."""
    chosen: dict[tuple[str, str, str], Run] = {}
    for run in runs:
        slot = (run.op, run.machine, run.fact("tag"))
        if run.clean and (slot not in chosen or run.key() > chosen[slot].key()):
            chosen[slot] = run
    return sorted(chosen.values(), key=lambda r: (r.op, _machine_order(r), r.fact("tag")))


def _machine_order(run: Run) -> tuple[bool, str, int, str]:
    """CPUs before GPUs; on a CPU the wider ISA and fewer threads first."""
    isa_rank = {"avx512": 0, "avx2": 1}.get(run.fact("isa"), 2)
    return run.fact("device") != "cpu", run.fact("machine"), isa_rank, run.machine


def machine_label(run: Run) -> str:
    if run.fact("device") != "cpu":
        return run.fact("machine")
    isa = {"avx512": "AVX-512", "avx2": "AVX2"}.get(run.fact("isa"), run.fact("isa"))
    threads = run.fact("threads")
    return f"{run.fact('machine')}, {isa}, {threads} thread{'' if threads == '1' else 's'}"


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _pairs(ours_name: str, times: dict[str, float]) -> list[tuple[str, str]]:
    """The (ours, other) provider pairs of one case. A run may time variants of every provider
    (bench_models: ``stock`` / ``fastops`` eager, ``stock_compile`` / ``fastops_compile``): a provider
    ``<ours>_<variant>`` is compared with the others of the same ``_<variant>`` suffix, and ours
    with the providers that are no variant of another, so compiled fastops meets compiled stock,
    not eager stock."""
    variants = {p.removeprefix(ours_name) for p in times if p.startswith(ours_name + "_")}
    pairs = []
    for ours_suffix in ["", *sorted(variants)]:
        ours = ours_name + ours_suffix
        if ours not in times:
            continue
        for other in times:
            if other == ours or other.startswith(ours_name):
                continue
            suffix = next((v for v in variants if other.endswith(v)), "")
            if suffix == ours_suffix:
                pairs.append((ours, other))
    return pairs


@dataclass
class Speedups:
    ours: str  # our provider's name
    ratios: dict[tuple[str, str], list[float]]  # (ours, other) -> other's time / ours, per case
    roofline: list[float]  # our % of the copy roofline, per case
    cases: int


def speedups(rows: Sequence[dict[str, str]]) -> Speedups:
    """The speedups of our provider over each other one, case by case."""
    # Our provider is "fastops"; a run comparing fastops paths with each other names ours "fused";
    # bench_swap_policy's subject is "auto", the swapped module as swap_modules leaves it.
    names = {r["provider"] for r in rows}
    ours_name = (
        "auto" if "auto" in names else "fastops" if "fastops" in names or "fused" not in names else "fused"
    )
    by_case: dict[tuple[str, ...], dict[str, float]] = {}
    roofline: list[float] = []
    for r in rows:
        key = (r["case"], r["direction"], r["dtype"], r["layout"], r["size"])
        by_case.setdefault(key, {})[r["provider"]] = float(r["median_ms"])
        if r["provider"] == ours_name:
            roofline.append(float(r["roofline_pct"]))
    ratios: dict[tuple[str, str], list[float]] = {}
    for times in by_case.values():
        for ours, other in _pairs(ours_name, times):
            ratios.setdefault((ours, other), []).append(times[other] / times[ours])
    return Speedups(ours_name, ratios, roofline, len(by_case))


def _ratio_text(values: list[float]) -> str:
    return (
        f"{_geomean(values):.2f}x ({min(values):.2f}-{max(values):.2f}x)"
        if len(values) > 1
        else f"{values[0]:.2f}x"
    )


def summary(rows: Sequence[dict[str, str]]) -> str:
    """One sentence over a run's rows: the geometric-mean speedup of ours over each other provider
    (with its range) and the median share of the copy roofline."""
    s = speedups(rows)
    if not s.ratios:
        return f"{s.cases} cases"
    cells = [
        ("" if ours == s.ours else f"{ours} over ") + f"{p} {_ratio_text(v)}"
        for (ours, p), v in sorted(s.ratios.items(), key=lambda kv: (kv[0][0] != s.ours, kv[0]))
    ]
    roof = sorted(s.roofline)
    # Training steps have no byte model (roofline 0): no roofline clause for them.
    roof_text = f"; median {roof[len(roof) // 2]:.0f}% of the copy roofline" if roof and roof[-1] > 0 else ""
    return f"{s.cases} cases; speedup of {s.ours} over " + ", ".join(cells) + roof_text


def op_page(op: str, runs: Sequence[Run]) -> str:
    """benchmarks/results/<op>.md: per machine (and tag), the chosen run's facts and full table."""
    lines = [
        f"# {op}",
        "",
        f"Generated by `python -m benchmarks.render_readme` from [data/{op}/](data/{op}/): per machine, the "
        "newest run measured from a committed tree (one per tag, a variant covering other cases). "
        "Older runs stay in the data and in git history; see [README.md](README.md) for the columns. "
        f"What each case and provider times, and the bytes it counts: [bench_{op}.py](../bench_{op}.py).",
    ]
    for run in runs:
        f = run.fact
        tag = f" ({f('tag')})" if f("tag") else ""
        cuda = f", CUDA {f('cuda')}" if f("cuda") not in ("", "None") else ""
        cores = f", {f('cores')} cores" if f("cores") else ""
        results = [common.result_from_row(r) for r in run.rows]
        lines += [
            "",
            f"## {machine_label(run)}{tag}",
            "",
            f"- run: [{run.path.name}](data/{op}/{run.path.name}), {f('date')}, git {f('git_sha')}",
            f"- machine: {f('machine')}{cores}; ISA {f('isa') or '-'}; clock: {f('clock') or '-'}",
            f"- versions: torch {f('torch')}{cuda}, python {f('python')}, fastops {f('fastops')} ({f('build')})",
            f"- command: `{f('command')}`",
            f"- {summary(run.rows)}",
            "",
            common.format_table(results, float(f("roofline_gbps") or 0)),
        ]
    if not runs:
        lines += ["", "No run from a committed tree yet."]
    return "\n".join(lines) + "\n"


# What a table cell is measured against, in order of preference, and the compiled baseline.
_BASELINES = ("eager", "stock", "torch_fused")
_COMPILED = "compile"


def _rows_for(run: Run, headline: Headline) -> list[dict[str, str]]:
    return [
        r
        for r in run.rows
        if (not headline.cases or r["case"] in headline.cases)
        and (not headline.directions or r["direction"] in headline.directions)
    ]


def table_cell(headline: Headline, runs: Sequence[Run]) -> str:
    """fastops' geomean speedup (range) over the baseline, and over torch.compile if timed, from the
    first of `runs` (one machine's chosen runs of the headline's ops, best first) with rows for it."""
    for run in runs:
        rows = _rows_for(run, headline)
        if not rows:
            continue
        s = speedups(rows)
        baseline = next((b for b in _BASELINES if (s.ours, b) in s.ratios), None)
        if baseline is None:
            continue
        text = f"[{_ratio_text(s.ratios[s.ours, baseline])}](benchmarks/results/{run.op}.md) vs {baseline}"
        if run.fact("tag"):
            text += f" ({run.fact('tag')} run)"
        if (s.ours, _COMPILED) in s.ratios:
            text += f"; {_geomean(s.ratios[s.ours, _COMPILED]):.2f}x vs compile"
        return text
    return "-"


def table(chosen: Sequence[Run]) -> str:
    """The README's block: a row per headline, a column per machine with a chosen run of one."""
    ops = {op for h in HEADLINES for op in h.ops}
    machines: dict[str, Run] = {}
    for run in sorted(chosen, key=_machine_order):
        if run.op in ops:
            machines.setdefault(run.machine, run)
    lines = [
        "| op | " + " | ".join(machine_label(r) for r in machines.values()) + " |",
        "|---|" + "---|" * len(machines),
    ]
    for h in HEADLINES:
        cells = []
        for machine in machines:
            # The untagged (full) run first, then the newest variant.
            runs = [r for r in chosen if r.op in h.ops and r.machine == machine]
            runs.sort(key=lambda r: r.fact("date"), reverse=True)
            runs.sort(key=lambda r: r.fact("tag") != "")
            cells.append(table_cell(h, runs))
        what = f"{h.what} ({h.note})" if h.note else h.what
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    versions: dict[str, list[str]] = {}
    for run in sorted(chosen, key=_machine_order):
        if run.op in ops:
            key = f"{machine_label(run)}, torch {run.fact('torch')}"
            versions.setdefault(key, []).append(run.fact("date")[:10])
    lines += [
        "",
        "Geometric mean of fastops' speedup over the cases of the newest run from a committed tree on "
        "each machine (its range in brackets): every direction, size, layout and dtype the run holds, "
        "each op called directly; - where no such run exists yet. The modules avoid the cases below "
        "1.0x: each measures our kernel against PyTorch's on the machine it runs on and keeps the "
        "faster ([kernel choice](docs/kernel_choice.md)). Runs: "
        + "; ".join(
            f"{key} ({min(d)}" + (f" to {max(d)})" if min(d) != max(d) else ")")
            for key, d in versions.items()
        )
        + ". Per op: "
        + ", ".join(f"[{op}](benchmarks/results/{op}.md)" for op in sorted({r.op for r in chosen}))
        + "; the data and how to add a run: [benchmarks/results](benchmarks/results/README.md).",
    ]
    return "\n".join(lines)


def index(chosen: Sequence[Run], runs: Sequence[Run]) -> str:
    """The generated part of benchmarks/results/README.md: each op's page and its machines."""
    lines = []
    for op in sorted({r.op for r in runs}):
        shown = [r for r in chosen if r.op == op]
        total = sum(1 for r in runs if r.op == op)
        where = "; ".join(
            f"{machine_label(r)}"
            + (f" ({r.fact('tag')})" if r.fact("tag") else "")
            + f", {r.fact('date')[:10]}"
            for r in shown
        )
        runs_text = f"{total} run{'' if total == 1 else 's'} in the data"
        lines.append(f"- [{op}]({op}.md): {where or 'no run from a committed tree yet'} ({runs_text})")
    return "\n".join(lines) if lines else "_no runs yet_"


def _between_markers(text: str, body: str, name: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"{name} lacks the {START} / {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{body}\n{END}{tail}"


def render(
    data: Path = DATA, results: Path = RESULTS, readme: Path = README, index_path: Path = INDEX
) -> dict[Path, str | None]:
    """Every generated file and its text; None for a page to delete (an op with no data left)."""
    runs = load_runs(data)
    chosen = choose(runs)
    out: dict[Path, str | None] = {
        readme: _between_markers(readme.read_text(), table(chosen), readme.name),
        index_path: _between_markers(index_path.read_text(), index(chosen, runs), index_path.name),
    }
    ops = sorted({r.op for r in runs})
    for op in ops:
        out[results / f"{op}.md"] = op_page(op, [r for r in chosen if r.op == op])
    for page in results.glob("*.md"):
        if page != index_path and page.stem not in ops:
            out[page] = None
    return out


def main() -> None:
    for path, text in render().items():
        if text is None:
            path.unlink()
        elif not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
