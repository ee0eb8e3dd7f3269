"""The verdicts, the ranking and the report (table, JSON, bar chart) of a doctor run.

The rule: a lever's speedup is the ratio of its samples/s to the baseline's, with a noise band from
the spread of both over their timed windows, ``[p20(lever) / p80(baseline), p80(lever) /
p20(baseline)]``. "apply" when the whole band is above 1.03x, "slower" when the whole band is below
0.97x, else "no gain"; a trial that failed (or broke the loss) is "failed: reason".
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

APPLY_ABOVE = 1.03
SLOWER_BELOW = 0.97
# A trial's mean loss over its timed steps may differ from the baseline's over the same steps by this
# much (relative, or absolute near zero): bf16 and a different summation order move it a little, a
# broken lever (NaN, a wrong gradient) moves it a lot.
LOSS_RTOL = 0.3
LOSS_ATOL = 0.05
SCHEMA = "fastops.doctor/1"


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of ``values`` by linear interpolation (q in [0, 1])."""
    s = sorted(values)
    if not s:
        raise ValueError("fastops.doctor: quantile of no values")
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Band:
    speedup: float  # median(lever) / median(baseline)
    low: float
    high: float


def speedup_band(rates: Sequence[float], baseline: Sequence[float]) -> Band:
    """The speedup of windows ``rates`` (samples/s) over the baseline's windows, with its noise band."""
    return Band(
        statistics.median(rates) / statistics.median(baseline),
        quantile(rates, 0.2) / quantile(baseline, 0.8),
        quantile(rates, 0.8) / quantile(baseline, 0.2),
    )


def verdict(band: Band) -> str:
    """ "apply", "slower" or "no gain", by where the whole noise band lies."""
    if band.low > APPLY_ABOVE:
        return "apply"
    if band.high < SLOWER_BELOW:
        return "slower"
    return "no gain"


def loss_problem(
    losses: Sequence[float], baseline: Sequence[float], *, one_sided: bool = False
) -> str | None:
    """Why the trial's losses break the numbers (not finite, or not close to the baseline's over the
    same steps), or None. ``one_sided``: only a higher loss counts (a larger batch of real data
    legitimately lowers it)."""
    if not losses:
        return None
    if not all(math.isfinite(v) for v in losses):
        return "the loss became NaN/inf"
    n = min(len(losses), len(baseline))
    if n == 0:
        return None
    mine, base = statistics.fmean(losses[:n]), statistics.fmean(baseline[:n])
    tolerance = max(LOSS_RTOL * abs(base), LOSS_ATOL)
    off = mine - base if one_sided else abs(mine - base)
    if off > tolerance:
        return f"the loss drifted from the baseline's (mean {mine:.4g} vs {base:.4g} over {n} steps)"
    return None


@dataclass
class Outcome:
    """One row of the report: a lever (or the baseline, or the combination) and what it measured."""

    name: str
    group: str
    verdict: str  # "apply", "slower", "no gain", "failed: reason", "baseline"
    code: list[str] = field(default_factory=list)
    samples_per_s: float | None = None  # median over the timed windows
    speedup: float | None = None
    band: tuple[float, float] | None = None
    peak_memory_mb: float | None = None
    batch_size: int | None = None
    data_wait_ms: float | None = None
    note: str = ""
    rates: list[float] = field(default_factory=list)  # samples/s per window
    wall_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.verdict.startswith("failed")


def rank(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Measured levers by speedup, fastest first, then the failed ones in trial order."""
    measured = sorted((o for o in outcomes if o.speedup is not None), key=lambda o: -(o.speedup or 0.0))
    return measured + [o for o in outcomes if o.speedup is None]


@dataclass
class Report:
    device: str
    budget_s: float
    elapsed_s: float
    batch_size: int
    steps_per_window: int
    windows: int
    baseline: Outcome
    levers: list[Outcome]  # ranked
    combination: Outcome | None
    recommended: list[str]  # lever names; empty: keep the baseline
    code: list[str]  # the lines that apply the recommendation
    skipped: list[dict[str, str]]  # {"name", "reason"}: not applicable, or no budget left
    order: list[str]  # the levers in the order they were tried
    profile: dict[str, Any] | None = None
    profile_of: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    busy: str | None = None  # a note when other jobs loaded the CPUs during the trials
    baseline_runs: int = 1  # the baseline row pools all of them

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["schema"] = SCHEMA
        out["rule"] = {"apply_above": APPLY_ABOVE, "slower_below": SLOWER_BELOW, "band": "p20/p80 of windows"}
        return out

    def table(self) -> str:
        """The ranked table, then the combination, what was skipped, and where the time goes."""
        rows = [
            "| lever | samples/s | speedup [noise band] | peak memory (MB) | verdict | to apply |",
            "|---|---:|---|---:|---|---|",
            _row(self.baseline),
            *(_row(o) for o in self.levers),
        ]
        if self.combination is not None:
            rows.append(_row(self.combination))
        lines = [
            f"fastops.doctor on {self.device}: batch {self.batch_size}, {self.windows} windows of "
            f"{self.steps_per_window} steps per trial, {self.baseline_runs} baseline runs, "
            f"{self.elapsed_s:.0f} s of a {self.budget_s:.0f} s budget",
            "",
            *rows,
            "",
        ]
        if self.recommended:
            lines.append(f"recommended: {' + '.join(self.recommended)}")
            lines += [f"    {line}" for line in self.code]
        else:
            lines.append("recommended: nothing measured faster than the baseline beyond its noise; keep it")
        if self.busy:
            lines.append(self.busy.strip())
        if self.skipped:
            lines.append("skipped: " + "; ".join(f"{s['name']} ({s['reason']})" for s in self.skipped))
        if self.profile:
            lines += ["", *profile_lines(self.profile, self.profile_of)]
        return "\n".join(lines)

    def write(self, out_dir: Path) -> list[Path]:
        """doctor.md, doctor.json and (with matplotlib) doctor.png into ``out_dir``; the paths written."""
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = [out_dir / "doctor.md", out_dir / "doctor.json"]
        paths[0].write_text(self.table() + "\n")
        with open(paths[1], "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")
        from fastops.train import extras

        if extras.optional("matplotlib", "no doctor.png is drawn", "matplotlib"):
            plot(self, out_dir / "doctor.png")
            paths.append(out_dir / "doctor.png")
        return paths


def _row(o: Outcome) -> str:
    rate = "-" if o.samples_per_s is None else f"{o.samples_per_s:.1f}"
    speed = "-" if o.speedup is None else f"{o.speedup:.2f}x"
    if o.band is not None:
        speed += f" [{o.band[0]:.2f}, {o.band[1]:.2f}]"
    memory = "-" if o.peak_memory_mb is None else f"{o.peak_memory_mb:.0f}"
    what = o.verdict + (f" ({o.note})" if o.note else "")
    return f"| {o.name} | {rate} | {speed} | {memory} | {what} | {'; '.join(o.code)} |"


def profile_lines(profile: dict[str, Any], of: str) -> list[str]:
    shares = profile["shares"]
    lines = [
        f"one profiled step of {of} ({profile['step_ms']:.1f} ms of {profile['time']} time): "
        + ", ".join(f"{k.replace('_', ' ')} {100 * v:.0f}%" for k, v in shares.items()),
        "| op | self time (ms) | calls | share of the step |",
        "|---|---:|---:|---:|",
    ]
    lines += [
        f"| {op['name']} | {op['self_ms']:.2f} | {op['calls']} | {100 * op['share']:.1f}% |"
        for op in profile["top_ops"]
    ]
    return lines


def plot(report: Report, path: Path) -> None:
    """Horizontal bars of the speedups with their noise bands, coloured by verdict."""
    from fastops.train.plots import _pyplot

    plt = _pyplot()
    rows = [o for o in [*report.levers, report.combination] if o is not None and o.speedup is not None]
    colours = {"apply": "tab:green", "slower": "tab:red", "no gain": "tab:gray"}
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
    names = [o.name for o in rows][::-1]
    values = [o.speedup or 0.0 for o in rows][::-1]
    errors = [
        [(o.speedup or 0) - (o.band or (0, 0))[0] for o in rows][::-1],
        [(o.band or (0, 0))[1] - (o.speedup or 0) for o in rows][::-1],
    ]
    ax.barh(names, values, xerr=errors, color=[colours.get(o.verdict, "tab:orange") for o in rows][::-1])
    ax.axvline(1.0, color="black", lw=1)
    for x in (SLOWER_BELOW, APPLY_ABOVE):
        ax.axvline(x, color="black", lw=0.7, ls="--")
    ax.set_xlabel(f"speedup over the baseline ({report.baseline.samples_per_s or 0:.1f} samples/s)")
    ax.set_title(f"fastops.doctor on {report.device}, batch {report.batch_size}")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
