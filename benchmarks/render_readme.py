"""Regenerates the README's benchmark summary from benchmarks/results/*.csv (never typed by hand).

For each result file it keeps, per (case, direction, dtype), the largest size measured and shows
fastops' median time, its speedup over every other provider in that row group and its share of the
copy roofline. A file with more than MAX_ROWS such groups (e.g. one row per layer shape) is folded
into one row per (variant, direction, dtype) with the geometric-mean speedup over all its cases; the
variant is the last word of a case name that has several ("mbv2.c32.112.k3 channels_last").

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
MAX_ROWS = 30
_SCALE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _size_key(size: str) -> float:
    """Element count of a size label: "64K", "4096x4096", "32x96x56x56" (0 when unreadable)."""
    factors = re.findall(r"(\d+)([KMG]?)", size)
    if not factors or not re.fullmatch(r"[\dKMG]+(x[\dKMG]+)*", size):
        return 0.0
    return float(math.prod(int(n) * _SCALE[unit] for n, unit in factors))


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(path: Path) -> str:
    header: dict[str, str] = {}
    table_lines: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("# ") and ": " in line:  # the environment lines write_results puts first
            key, value = line[2:].split(": ", 1)
            header[key] = value
        else:
            table_lines.append(line)
    rows = list(csv.DictReader(table_lines))
    if not rows:
        return ""
    groups: dict[tuple[str, str, str], dict[str, dict[str, dict[str, str]]]] = {}
    for r in rows:
        groups.setdefault((r["case"], r["direction"], r["dtype"]), {}).setdefault(r["size"], {})[
            r["provider"]
        ] = r
    # Our provider is "fastops"; a file comparing fastops paths with each other names ours "fused".
    names = {r["provider"] for r in rows}
    ours_name = "fastops" if "fastops" in names or "fused" not in names else "fused"
    providers = sorted(names - {ours_name})
    title = (
        f"**{path.stem}** — {header.get('device', '?')}, torch {header.get('torch', '?')}, "
        f"{header.get('date', '?')}, git {header.get('git', '?')}; copy roofline "
        f"{header.get('copy_roofline_gbps', '?')} GB/s ([full table](benchmarks/results/{path.stem}.md))"
    )
    if len(groups) > MAX_ROWS:
        return "\n".join([title, "", *_folded_table(groups, providers, ours_name)])
    out = [
        title,
        "",
        f"| case | dir | dtype | size | {ours_name} ms | % roofline | "
        + " | ".join(f"vs {p}" for p in providers)
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(providers),
    ]
    for (case, direction, dtype), by_size in groups.items():
        size = max(by_size, key=_size_key)
        group = by_size[size]
        ours = group.get(ours_name)
        if ours is None:
            continue
        ratios = [
            f"{float(group[p]['median_ms']) / float(ours['median_ms']):.2f}x" if p in group else ""
            for p in providers
        ]
        out.append(
            f"| {case} | {direction} | {dtype} | {size} | {float(ours['median_ms']):.4f} | "
            f"{float(ours['roofline_pct']):.0f}% | " + " | ".join(ratios) + " |"
        )
    return "\n".join(out)


def _folded_table(
    groups: dict[tuple[str, str, str], dict[str, dict[str, dict[str, str]]]],
    providers: list[str],
    ours_name: str,
) -> list[str]:
    """One row per (variant, direction, dtype): geometric-mean speedup of fastops over each provider
    across every (case, size) measured, and the median share of the roofline."""
    folded: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for (case, direction, dtype), by_size in groups.items():
        variant = case.split()[-1] if len(case.split()) > 1 else ""
        for group in by_size.values():
            ours = group.get(ours_name)
            if ours is None:
                continue
            acc = folded.setdefault((variant, direction, dtype), {})
            acc.setdefault("roofline", []).append(float(ours["roofline_pct"]))
            for p in providers:
                if p in group:
                    acc.setdefault(p, []).append(float(group[p]["median_ms"]) / float(ours["median_ms"]))
    out = [
        "| variant | dir | dtype | cases | median % roofline | "
        + " | ".join(f"vs {p} (geomean)" for p in providers)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(providers),
    ]
    for (variant, direction, dtype), acc in sorted(folded.items()):
        roof = sorted(acc["roofline"])
        cells = [f"{_geomean(acc[p]):.2f}x" if p in acc else "" for p in providers]
        out.append(
            f"| {variant} | {direction} | {dtype} | {len(roof)} | {roof[len(roof) // 2]:.0f}% | "
            + " | ".join(cells)
            + " |"
        )
    return out


def main() -> None:
    # Repeat runs (<stem>_run2, ...) stay in results/ for the record; the README shows the first.
    files = [p for p in sorted(RESULTS.glob("*.csv")) if not re.search(r"_run\d+$", p.stem)]
    sections = [s for s in (summarize(p) for p in files) if s]
    text = README.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"README.md lacks the {START} / {END} markers")
    body = "\n\n".join(sections) if sections else "_no results yet_"
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{body}\n{END}{tail}")
    print(f"README.md: {len(sections)} result files summarized")


if __name__ == "__main__":
    main()
