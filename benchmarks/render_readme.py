"""Regenerates the README's benchmark table and the index of every result file (never typed by hand).

README.md gets one row per op, a cell per machine (the AVX-512 and AVX2 builds on a CPU, a GPU): the
geometric-mean speedup of fastops over eager (stock for training steps, torch's fused AdamW for the
optimizer) and over torch.compile where the file timed it, across the cases of one chosen result file
(HEADLINES), linking to its full table. benchmarks/results/README.md gets one line per result file,
every file there.

    python -m benchmarks.render_readme
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parent.parent / "README.md"
INDEX = RESULTS / "README.md"
START, END = "<!-- bench-summary:start -->", "<!-- bench-summary:end -->"
COLUMNS = ("CPU, AVX-512 build", "CPU, AVX2 build", "GPU")


@dataclass(frozen=True)
class Cell:
    """One result file, optionally only some of its cases and directions (its `case` and `direction`
    columns)."""

    stem: str
    cases: tuple[str, ...] = ()
    directions: tuple[str, ...] = ()


@dataclass(frozen=True)
class Headline:
    """A row of the README table: one cell per COLUMNS entry (None: not measured there)."""

    what: str
    cells: tuple[Cell | None, Cell | None, Cell | None]
    note: str = ""


# The files that stand for each op today: the newest full run per machine. Change a cell when a newer
# run replaces it; test_render_readme checks that every file named here exists.
HEADLINES = (
    Headline(
        "clipped_log",
        (
            Cell("clipped_log_cpu_zen5_threads1"),
            Cell("clipped_log_cpu_avx2_zen5_threads1"),
            Cell("clipped_log_cuda_h200_quick"),
        ),
    ),
    Headline(
        "gelu, erf form",
        (
            Cell("gelu_cpu_zen5_threads1_compile", ("erf",)),
            Cell("gelu_cpu_avx2_zen5_threads1_compile", ("erf",)),
            Cell("gelu_cuda_h200_quick", ("erf",)),
        ),
        "on the H200 below eager: nn.GELU measures and keeps PyTorch's there",
    ),
    Headline(
        "bias_gelu, erf form",
        (
            Cell("gelu_cpu_zen5_threads1_compile", ("bias_gelu_erf",)),
            Cell("gelu_cpu_avx2_zen5_threads1_compile", ("bias_gelu_erf",)),
            Cell("gelu_cuda_h200_quick", ("bias_gelu_erf",)),
        ),
    ),
    Headline(
        "FusedAdamW step (vs torch's fused AdamW)",
        (
            Cell("fused_adam_cpu_zen5_threads1"),
            Cell("fused_adam_cpu_avx2_float32_zen5_threads1"),
            Cell("fused_adam_cuda_h200_quick"),
        ),
    ),
    Headline(
        "depthwise_conv2d",
        (
            Cell("depthwise_conv2d_cpu_zen5_threads1_head"),
            Cell("depthwise_conv2d_cpu_avx2_zen5_threads1_head"),
            Cell("depthwise_conv2d_cuda"),
        ),
        "on the H200 cuDNN is faster except fp32 channels_last 7x7",
    ),
    Headline(
        "depthwise + 1x1, fused forward",
        (
            Cell("depthwise_separable_conv2d_cpu_zen5_threads1", directions=("fwd",)),
            Cell("depthwise_separable_conv2d_cpu_avx2_zen5_threads1", directions=("fwd",)),
            None,
        ),
        "inference only; below 1.0x the module measures and runs the pair",
    ),
    Headline(
        "squeeze_excite",
        (Cell("squeeze_excite_cpu_zen5_threads1"), Cell("squeeze_excite_cpu_avx2_zen5_threads1"), None),
    ),
    Headline(
        "batch_norm",
        (Cell("batch_norm_cpu_zen5_threads1"), Cell("batch_norm_cpu_avx2_zen5_threads1"), None),
        "not yet run on a GPU",
    ),
    Headline(
        "training step, timm models (swapped + FusedAdamW vs stock)",
        (
            Cell("models_cpu_zen5_threads1_policy"),
            Cell("models_cpu_avx2_zen5_threads1_policy"),
            Cell("train_cuda_h200"),
        ),
    ),
)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _read(path: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The environment lines write_results puts first ("# key: value"), and the CSV rows."""
    header: dict[str, str] = {}
    table_lines: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("# ") and ": " in line:
            key, value = line[2:].split(": ", 1)
            header[key] = value
        else:
            table_lines.append(line)
    return header, list(csv.DictReader(table_lines))


def _pairs(ours_name: str, times: dict[str, float]) -> list[tuple[str, str]]:
    """The (ours, other) provider pairs of one case. A file may time variants of every provider
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


def _speedups(
    path: Path, cases: tuple[str, ...] = (), directions: tuple[str, ...] = ()
) -> tuple[dict[str, str], str, dict[tuple[str, str], list[float]], list[float], int]:
    """The file's header, our provider's name, the speedups of each (ours, other) pair per case,
    our roofline shares and the number of cases; only the rows of `cases` and `directions` when given."""
    header, rows = _read(path)
    rows = [
        r
        for r in rows
        if (not cases or r["case"] in cases) and (not directions or r["direction"] in directions)
    ]
    # Our provider is "fastops"; a file comparing fastops paths with each other names ours "fused";
    # bench_swap_policy's subject is "auto", the swapped module as swap_modules leaves it.
    names = {r["provider"] for r in rows}
    ours_name = (
        "auto" if "auto" in names else "fastops" if "fastops" in names or "fused" not in names else "fused"
    )
    by_case: dict[tuple[str, ...], dict[str, float]] = {}
    roofline: list[float] = []
    for r in rows:
        key = (r["case"], r["direction"], r["dtype"], r["size"])
        by_case.setdefault(key, {})[r["provider"]] = float(r["median_ms"])
        if r["provider"] == ours_name:
            roofline.append(float(r["roofline_pct"]))
    ratios: dict[tuple[str, str], list[float]] = {}
    for times in by_case.values():
        for ours, other in _pairs(ours_name, times):
            ratios.setdefault((ours, other), []).append(times[other] / times[ours])
    return header, ours_name, ratios, roofline, len(by_case)


def _ratio_text(values: list[float]) -> str:
    return (
        f"{_geomean(values):.2f}x ({min(values):.2f}-{max(values):.2f}x)"
        if len(values) > 1
        else f"{values[0]:.2f}x"
    )


def headline(path: Path, link_dir: str = "benchmarks/results/") -> str:
    """One line for one result file: over every case measured, the geometric-mean speedup of ours
    over each other provider (with its range) and the median share of the copy roofline."""
    header, ours_name, ratios, roofline, n_cases = _speedups(path)
    if not n_cases:
        return ""
    cells = [
        ("" if ours == ours_name else f"{ours} over ") + f"{p} {_ratio_text(v)}"
        for (ours, p), v in sorted(ratios.items(), key=lambda kv: (kv[0][0] != ours_name, kv[0]))
    ]
    roof = sorted(roofline)
    # Training-step files have no byte model (roofline 0): no roofline clause for them.
    roof_text = f"; median {roof[len(roof) // 2]:.0f}% of the copy roofline" if roof and roof[-1] > 0 else ""
    device = header.get("device", "?").split(",")[0]
    date = header.get("date", "?")[:10]
    return (
        f"- **{path.stem}** ({device}, torch {header.get('torch', '?')}, {date}): {n_cases} cases; "
        f"speedup of {ours_name} over "
        + ", ".join(cells)
        + roof_text
        + f" ([full table]({link_dir}{path.stem}.md))"
    )


# What a table cell is measured against, in order of preference, and the compiled baseline.
_BASELINES = ("eager", "stock", "torch_fused")
_COMPILED = "compile"


def table_cell(cell: Cell | None) -> str:
    """fastops' geomean speedup (range) over the cell's baseline, and over torch.compile if timed."""
    if cell is None:
        return "not measured yet"
    _, ours_name, ratios, _, n_cases = _speedups(RESULTS / f"{cell.stem}.csv", cell.cases, cell.directions)
    if not n_cases:
        raise SystemExit(f"{cell.stem}: no rows for cases {cell.cases} and directions {cell.directions}")
    baseline = next((b for b in _BASELINES if (ours_name, b) in ratios), None)
    if baseline is None:
        raise SystemExit(f"{cell.stem}: none of {_BASELINES} was timed")
    text = f"[{_ratio_text(ratios[ours_name, baseline])}](benchmarks/results/{cell.stem}.md) vs {baseline}"
    if (ours_name, _COMPILED) in ratios:
        text += f"; {_geomean(ratios[ours_name, _COMPILED]):.2f}x vs compile"
    return text


def _machines(column: int) -> str:
    """The machines, torch versions, threads and dates behind one column of the table."""
    seen: dict[str, list[str]] = {}
    for row in HEADLINES:
        cell = row.cells[column]
        if cell is None:
            continue
        header, _ = _read(RESULTS / f"{cell.stem}.csv")
        parts = header.get("device", "?").split(", ")
        threads = next((p.removeprefix("torch threads ") for p in parts if p.startswith("torch threads")), "")
        machine = parts[0] + (f", {threads} thread{'s' if threads != '1' else ''}" if threads else "")
        key = f"{machine}, torch {header.get('torch', '?')}"
        seen.setdefault(key, []).append(header.get("date", "?")[:10])
    return "; ".join(
        f"{key} ({min(dates)} to {max(dates)})" if min(dates) != max(dates) else f"{key} ({dates[0]})"
        for key, dates in seen.items()
    )


def table() -> str:
    lines = [
        "| op | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for row in HEADLINES:
        what = f"{row.what} ({row.note})" if row.note else row.what
        lines.append(f"| {what} | " + " | ".join(table_cell(c) for c in row.cells) + " |")
    lines.append("")
    lines.append(
        "Geometric mean of fastops' speedup over the cases of one result file (its range in brackets): "
        "every direction, size, layout and dtype the file holds, each op called directly. The modules "
        "avoid the cases below 1.0x: each measures our kernel against PyTorch's on the machine it runs on "
        "and keeps the faster ([kernel choice](docs/kernel_choice.md)). Machines: "
        + " ".join(f"{name}: {_machines(i)}." for i, name in enumerate(COLUMNS))
        + " Every result file: [benchmarks/results/README.md](benchmarks/results/README.md)."
    )
    return "\n".join(lines)


def _replace_between_markers(path: Path, body: str) -> None:
    text = path.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{path} lacks the {START} / {END} markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n{body}\n{END}{tail}")


def result_files() -> list[Path]:
    # Repeat runs (<stem>_run2, ...) and rechecks of a few rows (<stem>_recheck...) stay in results/
    # for the record; the index shows the full run.
    return [p for p in sorted(RESULTS.glob("*.csv")) if not re.search(r"_run\d+$|_recheck", p.stem)]


def main() -> None:
    _replace_between_markers(README, table())
    lines = [s for s in (headline(p, link_dir="") for p in result_files()) if s]
    if not INDEX.exists():
        INDEX.write_text(_INDEX_HEAD + f"{START}\n{END}\n")
    _replace_between_markers(INDEX, "\n".join(lines) if lines else "_no results yet_")
    print(f"README.md: {len(HEADLINES)} ops; benchmarks/results/README.md: {len(lines)} result files")


_INDEX_HEAD = """# Benchmark results

Every result file, one line each: the geometric-mean speedup of fastops over each other provider across
the file's cases, its range, and the median share of the copy roofline. Each `.md` holds the full table
and the machine, versions, git sha, date and command of its run; dated narratives (`*.md` without a
`.csv`) record what a change predicted and what it measured. Generated by
`python -m benchmarks.render_readme`; the README's table picks one file per op and machine.

"""


if __name__ == "__main__":
    main()
