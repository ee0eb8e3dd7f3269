"""Regenerates the README's benchmark summary from benchmarks/results/*.csv (never typed by hand).

One headline line per result file (op and device): the geometric-mean speedup of fastops over
each other provider across every case measured, with its range, and the median share of the copy
roofline, linking to the full table. The full tables stay in benchmarks/results/*.md.

    python -m benchmarks.render_readme
"""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- bench-summary:start -->", "<!-- bench-summary:end -->"


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


def headline(path: Path) -> str:
    """One line for one result file: over every case measured, the geometric-mean speedup of ours
    over each other provider (with its range) and the median share of the copy roofline."""
    header, rows = _read(path)
    if not rows:
        return ""
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
    cells = [
        ("" if ours == ours_name else f"{ours} over ")
        + (f"{p} {_geomean(v):.2f}x ({min(v):.2f}-{max(v):.2f}x)" if len(v) > 1 else f"{p} {v[0]:.2f}x")
        for (ours, p), v in sorted(ratios.items(), key=lambda kv: (kv[0][0] != ours_name, kv[0]))
    ]
    roof = sorted(roofline)
    # Training-step files have no byte model (roofline 0): no roofline clause for them.
    roof_text = f"; median {roof[len(roof) // 2]:.0f}% of the copy roofline" if roof and roof[-1] > 0 else ""
    device = header.get("device", "?").split(",")[0]
    date = header.get("date", "?")[:10]
    return (
        f"- **{path.stem}** ({device}, torch {header.get('torch', '?')}, {date}): {len(by_case)} cases; "
        f"speedup of {ours_name} over "
        + ", ".join(cells)
        + roof_text
        + f" ([full table](benchmarks/results/{path.stem}.md))"
    )


def main() -> None:
    # Repeat runs (<stem>_run2, ...) and rechecks of a few rows (<stem>_recheck...) stay in results/
    # for the record; the README shows the full run.
    files = [p for p in sorted(RESULTS.glob("*.csv")) if not re.search(r"_run\d+$|_recheck", p.stem)]
    sections = [s for s in (headline(p) for p in files) if s]
    text = README.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"README.md lacks the {START} / {END} markers")
    body = "\n".join(sections) if sections else "_no results yet_"
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{body}\n{END}{tail}")
    print(f"README.md: {len(sections)} result files summarized")


if __name__ == "__main__":
    main()
