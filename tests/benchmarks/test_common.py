"""benchmarks/common.py: --check (which row groups count as a fastops path below its baseline) and
--thread-time, and the run file it writes."""

from __future__ import annotations

import csv
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import common


def _row(case: str, provider: str, median_ms: float, dtype: torch.dtype = torch.float32) -> common.Result:
    return common.result_from_times(case, case, "fwd", dtype, "1M", provider, [median_ms], 0, 0.0)


def test_check_flags_only_groups_where_ours_is_slower() -> None:
    rows = [
        _row("fast", "fastops", 1.0),
        _row("fast", "eager", 2.0),
        _row("slow", "fastops", 2.0),
        _row("slow", "eager", 1.6),
        _row("slow", "compile", 4.0),  # not a baseline: a slower compile does not hide the loss
        _row("alone", "fastops", 9.0),  # no baseline timed in this group: nothing to compare
    ]
    failures = common.check_speedups(rows)
    assert [(f.group[0], f.ours, f.baseline) for f in failures] == [("slow", "fastops", "eager")]
    assert abs(failures[0].speedup - 0.8) < 1e-12
    assert str(failures[0]) == "slow fwd float32 1M: fastops 0.80x eager"


def test_check_uses_the_bench_pairs_and_keeps_dtypes_apart() -> None:
    rows = [
        _row("adam", "fastops", 1.0),
        _row("adam", "torch_fused", 0.9),
        _row("adam", "eager", 5.0),
        _row("adam", "fastops", 1.0, torch.bfloat16),
        _row("adam", "torch_fused", 1.1, torch.bfloat16),
    ]
    failures = common.check_speedups(rows, pairs=[("fastops", "torch_fused")])
    assert [f.group[2] for f in failures] == ["float32"]
    assert common.check_speedups(rows) == []  # against eager, fastops wins


def test_thread_time_leaves_out_time_spent_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    # A call that waits 20 ms computes almost nothing: wall clock counts the wait, thread time not.
    wall = common.time_ms(lambda: time.sleep(0.02), "cpu", min_time=0.0, warmup=0, min_reps=1, max_reps=1)
    monkeypatch.setattr(common, "_CPU_CLOCK", [time.thread_time])
    cpu = common.time_ms(lambda: time.sleep(0.02), "cpu", min_time=0.0, warmup=0, min_reps=1, max_reps=1)
    assert wall[0] >= 19.0 and cpu[0] < 5.0


def test_thread_time_needs_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "_CPU_CLOCK", [time.perf_counter])
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit):
            common.run_benchmark(
                "none",
                lambda args: iter(()),
                description="",
                argv=["--device", "cpu", "--threads", "2", "--thread-time"],
            )
    finally:
        torch.set_num_threads(threads)
    assert common._CPU_CLOCK[0] is time.perf_counter


def test_a_run_writes_one_long_format_file_with_its_facts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(common, "_git_state", lambda: ("abc1234", True))
    extra: dict[str, float | str] = {
        "layout": "channels_last",
        "tflops": 1.5,
        "speedup_vs_stock": 2.0,
        "reps": 7,
    }
    results = [
        common.Result("conv", "c", "fwd", "float32", "8x8", "fastops", 1.0, 0.9, 1.1, 64, 6.4e-05, 0.1, extra)
    ]
    path = common.write_results("conv", "cpu", results, 50.0, tmp_path, tag="cl")
    assert path.parent == tmp_path / "conv" and path.name.endswith("_abc1234-dirty_cl.csv")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames or ()) == common.COLUMNS
    (row,) = rows
    assert (row["dirty"], row["git_sha"], row["tag"], row["device"]) == ("true", "abc1234", "cl", "cpu")
    assert (row["layout"], row["speedup"], row["speedup_over"], row["roofline_gbps"]) == (
        "channels_last",
        "2",
        "stock",
        "50.0",
    )
    assert row["machine_tag"] in path.name and row["machine_tag"].endswith(f"-t{row['threads']}")
    assert common.result_from_row(row).extra == extra


def _sleepy_cases(auto_ms: list[float]) -> Callable[[Any], Iterator[common.BenchCase]]:
    """One row group; "auto" sleeps auto_ms[0] ms per call on the first pass over the cases, then
    auto_ms[1] on the next (a --check re-timing), "torch" 2 ms throughout."""
    passes = [0]

    def cases(args: Any) -> Iterator[common.BenchCase]:
        ms = auto_ms[min(passes[0], len(auto_ms) - 1)]
        passes[0] += 1
        providers = {"auto": lambda: time.sleep(ms / 1e3), "torch": lambda: time.sleep(2e-3)}
        yield common.BenchCase("c", "fwd", torch.float32, "8", providers)

    return cases


@pytest.mark.parametrize(
    ("auto_ms", "fails"), [((3.0, 2.0), False), ((3.0, 3.0), True)], ids=["noise", "slower"]
)
def test_check_times_suspects_again_before_failing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], auto_ms, fails
) -> None:
    monkeypatch.setattr(common, "_git_state", lambda: ("abc1234", False))
    argv = ["--device", "cpu", "--min-time", "0.03", "--check", "--out", str(tmp_path), "--fresh-pages"]
    run = lambda: common.run_benchmark(  # noqa: E731
        "sleepy",
        _sleepy_cases(list(auto_ms)),
        description="",
        argv=argv,
        check_pairs=(("auto", "torch"),),
        check_minimum=0.97,
    )
    if fails:
        with pytest.raises(SystemExit):
            run()
    else:
        run()
    out = capsys.readouterr().out
    assert "timing them again" in out
    assert ("check FAILED" in out) == fails and ("check passed" in out) != fails
