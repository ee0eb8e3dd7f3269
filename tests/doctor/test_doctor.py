"""The doctor's run: trial order, combination, recommendation, budget and every failure path, with
scripted trials and an injected clock (deterministic); the trial itself with an injected clock; the
trial processes' crash and timeout; and two real runs on the CPU (the bundled convnet through
examine(), a user's model through the command line)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import fastops.doctor.trial as trial_module
from fastops.doctor import Doctor, Lever, TrialConfig, default_blocks, examine, levers
from fastops.doctor.cli import main
from fastops.doctor.report import SCHEMA
from fastops.doctor.trial import (
    Payload,
    Plan,
    SubprocessRunner,
    TrialResult,
    in_process_runner,
    run_trial,
    scaled_batch,
)
from tests.doctor import models

BASE_RATES = [98.0, 99.0, 100.0, 101.0, 102.0]
VERDICTS = ("apply", "slower", "no gain")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _payload(**kw: Any) -> Payload:
    # One thread: the CI machine's two cores are shared with other jobs, where two threads of a tiny
    # model mostly wait for each other.
    kw.setdefault("threads", 1)
    return Payload(models.tiny_convnet(), models.digits_batch(), "cpu", blocks=("blocks.0", "blocks.1"), **kw)


def _config_names() -> dict[TrialConfig, str]:
    names = {lever.apply(TrialConfig()): lever.name for lever in levers()}
    names[TrialConfig()] = "baseline"
    return names


class Scripted:
    """Trials answered from a script: ``speed[name]`` times the baseline's rates, each trial taking
    ``wall`` seconds of the fake clock (or its timeout, and then failing as the real runner does)."""

    def __init__(
        self,
        clock: FakeClock,
        speed: dict[str, float],
        *,
        wall: float = 10.0,
        walls: dict[str, float] | None = None,
        fail: dict[str, str] | None = None,
        losses: dict[str, list[float]] | None = None,
    ) -> None:
        self.clock, self.speed, self.wall = clock, speed, wall
        self.walls, self.fail, self.losses = walls or {}, fail or {}, losses or {}
        self.calls: list[tuple[str, TrialConfig, Plan, float]] = []

    def __call__(self, cfg: TrialConfig, plan: Plan) -> TrialResult:
        name = _config_names().get(cfg, "combination")
        self.calls.append((name, cfg, plan, self.clock.now))
        wall = self.walls.get(name, self.wall)
        if plan.timeout_s is not None and wall > plan.timeout_s:
            self.clock.now += plan.timeout_s
            return TrialResult(ok=False, error="timed out", wall_s=plan.timeout_s)
        self.clock.now += wall
        if name in self.fail:
            return TrialResult(ok=False, error=self.fail[name], wall_s=wall)
        s = self.speed.get(name, 1.0)
        return TrialResult(
            ok=True,
            samples_per_s=[r * s for r in BASE_RATES],
            losses=self.losses.get(name, [2.0, 1.5, 1.0]),
            peak_memory_mb=100.0 / s,
            memory_before_mb=50.0,
            warmup_s=1.0,
            steps_per_window=4,
            batch_size=16,
            wall_s=wall,
            profile={"step_ms": 1.0, "time": "cpu", "shares": {"optimizer": 0.1}, "top_ops": []}
            if plan.profile
            else None,
        )


def _doctor(runner: Any, clock: FakeClock, names: Sequence[str], budget: float = 1000.0, **kw: Any) -> Doctor:
    return Doctor(_payload(**kw), runner, budget, levers(names), clock=clock, log=lambda line: None)


def test_ranking_verdicts_and_combination() -> None:
    clock = FakeClock()
    speed = {
        "amp-bf16": 1.5,
        "channels-last": 0.5,
        "fused-adamw": 1.01,
        "adamw-foreach": 1.2,
        "adamw-fused": 1.1,
        "combination": 1.8,
    }
    runner = Scripted(clock, speed)
    names = ["amp-bf16", "channels-last", "fused-adamw", "adamw-foreach", "adamw-fused"]
    report = _doctor(runner, clock, names).run()

    # Trial order: the levers in registry order between baselines (one after every three levers and
    # one closing), then the combination.
    expected = ["baseline", *names[:3], "baseline", *names[3:], "baseline", "combination"]
    assert [c[0] for c in runner.calls] == expected
    assert [o.name for o in report.levers] == [
        "amp-bf16",
        "adamw-foreach",
        "adamw-fused",
        "fused-adamw",
        "channels-last",
    ]
    verdicts = {o.name: o.verdict for o in report.levers}
    assert verdicts == {
        "amp-bf16": "apply",
        "adamw-foreach": "apply",
        "adamw-fused": "apply",
        "fused-adamw": "no gain",
        "channels-last": "slower",
    }
    # The best of each group: bf16 and foreach (not fused, the slower of the optimizer group).
    combo_cfg = runner.calls[-1][1]
    assert combo_cfg == TrialConfig(amp="bf16", optimizer="foreach")
    assert runner.calls[-1][2].profile
    assert report.combination is not None and report.combination.speedup == pytest.approx(1.8)
    assert report.recommended == ["amp-bf16", "adamw-foreach"]
    assert any("bfloat16" in line for line in report.code) and any(
        "foreach=True" in line for line in report.code
    )
    assert report.profile_of == "the combination"
    # Every later trial runs the baseline's window length.
    assert {c[2].steps_per_window for c in runner.calls[1:]} == {4}
    assert report.elapsed_s == pytest.approx(10.0 * 9)
    assert report.baseline_runs == 3


def test_levers_are_compared_with_the_baselines_around_them() -> None:
    """The machine gets twice as fast after the fifth trial (the bracketing baseline): levers that
    change nothing must not come out "apply" (they would, at 2x, against the first baseline alone)."""
    clock = FakeClock()

    class Drifting(Scripted):
        def __call__(self, cfg: TrialConfig, plan: Plan) -> TrialResult:
            result = super().__call__(cfg, plan)
            if len(self.calls) > 5:
                result.samples_per_s = [2 * r for r in result.samples_per_s]
            return result

    names = ["amp-bf16", "channels-last", "fused-adamw", "adamw-foreach", "adamw-fused"]
    runner = Drifting(clock, {})
    report = _doctor(runner, clock, names).run()
    assert [c[0] for c in runner.calls][:5] == [
        "baseline",
        "amp-bf16",
        "channels-last",
        "fused-adamw",
        "baseline",
    ]
    verdicts = {o.name: o.verdict for o in report.levers}
    assert set(verdicts.values()) == {"no gain"}, verdicts
    speedups = {o.name: o.speedup for o in report.levers}
    assert speedups["amp-bf16"] == pytest.approx(1.0)  # both its baselines before the drift
    assert speedups["adamw-fused"] < 1.5  # one baseline before the drift, one after: a wide band
    # The baseline row pools every run: its band shows the drift.
    assert report.baseline.band is not None and report.baseline.band[1] > 1.5


def test_combination_slower_than_best_single_recommends_the_single() -> None:
    clock = FakeClock()
    runner = Scripted(clock, {"amp-bf16": 1.5, "adamw-foreach": 1.2, "combination": 1.3})
    report = _doctor(runner, clock, ["amp-bf16", "adamw-foreach"]).run()
    assert report.recommended == ["amp-bf16"]
    assert report.code == list(levers(["amp-bf16"])[0].code)


def test_nothing_applies_keeps_the_baseline_and_profiles_it() -> None:
    clock = FakeClock()
    runner = Scripted(clock, {"channels-last": 1.0})
    report = _doctor(runner, clock, ["channels-last"]).run()
    assert report.combination is None and report.recommended == [] and report.code == []
    assert report.profile_of == "the baseline" and report.profile is not None
    assert "keep it" in report.table()


def test_budget_is_honoured_and_skips_are_listed() -> None:
    clock = FakeClock()
    runner = Scripted(clock, {"amp-bf16": 1.5}, wall=10.0, walls={"compile": 500.0})
    names = ["amp-bf16", "channels-last", "fused-adamw", "compile", "batch-x2", "batch-x4"]
    budget = 75.0
    start = clock.now
    report = _doctor(runner, clock, names, budget=budget).run()
    assert clock.now - start <= budget
    assert report.elapsed_s <= budget
    # No trial may run past the budget: each one's timeout is at most what is left.
    for _, _, plan, at in runner.calls:
        assert plan.timeout_s is not None and at + plan.timeout_s <= start + budget + 1e-9
    skipped = {s["name"]: s["reason"] for s in report.skipped}
    assert "compile" in skipped and skipped["compile"].startswith("budget")
    assert skipped["batch-x2"].startswith("budget") and skipped["batch-x4"].startswith("budget")
    # 10 s trials, 25 s kept for the second baseline and the combination (with the 1.25 margin):
    # three levers fit, compile (~75 s) and the batches (~15, ~25 s) no longer do. The combination
    # of the one "apply" lever is that lever's config, measured again with a profile.
    ran = [c[0] for c in runner.calls]
    assert ran == ["baseline", "amp-bf16", "channels-last", "fused-adamw", "baseline", "amp-bf16"]


def test_the_second_baseline_leaves_room_for_the_combination() -> None:
    clock = FakeClock()
    runner = Scripted(clock, {"amp-bf16": 1.5}, wall=10.0, walls={"channels-last": 30.0})
    start, budget = clock.now, 70.0
    report = _doctor(runner, clock, ["amp-bf16", "channels-last"], budget=budget).run()
    assert [c[0] for c in runner.calls] == ["baseline", "amp-bf16", "channels-last", "baseline", "amp-bf16"]
    _, _, plan, at = runner.calls[3]
    assert plan.timeout_s is not None and at + plan.timeout_s <= start + budget - 1.25 * 10.0
    assert report.combination is not None and report.recommended == ["amp-bf16"]
    assert {o.name: o.verdict for o in report.levers}["channels-last"] == "failed: timed out"


def test_oom_in_a_smaller_batch_skips_the_larger() -> None:
    clock = FakeClock()
    runner = Scripted(clock, {}, fail={"batch-x2": "out of memory"})
    report = _doctor(runner, clock, ["batch-x2", "batch-x4"]).run()
    assert {o.name: o.verdict for o in report.levers} == {"batch-x2": "failed: out of memory"}
    assert {"name": "batch-x4", "reason": "a smaller batch already ran out of memory"} in report.skipped


def test_broken_loss_is_a_failed_lever() -> None:
    clock = FakeClock()
    runner = Scripted(
        clock,
        {"amp-bf16": 2.0, "channels-last": 2.0},
        losses={"amp-bf16": [2.0, math.nan, 1.0], "channels-last": [9.0, 9.0, 9.0]},
    )
    report = _doctor(runner, clock, ["amp-bf16", "channels-last"]).run()
    verdicts = {o.name: o.verdict for o in report.levers}
    assert verdicts["amp-bf16"] == "failed: the loss became NaN/inf"
    assert verdicts["channels-last"].startswith("failed: the loss drifted")
    assert report.recommended == []


def test_levers_that_do_not_apply_on_the_cpu_are_skipped_with_the_reason() -> None:
    clock = FakeClock()
    report = _doctor(Scripted(clock, {}), clock, ["amp-fp16", "cudnn-benchmark", "loader-workers"]).run()
    assert {s["name"]: s["reason"] for s in report.skipped} == {
        "amp-fp16": "CUDA only",
        "cudnn-benchmark": "CUDA only",
        "loader-workers": "needs data= (a Dataset) or --data digits|DIR",
    }


def test_a_lever_that_raises_is_failed_not_a_crash() -> None:
    def boom(cfg: TrialConfig) -> TrialConfig:
        raise RuntimeError("boom")

    def bad_applies(ctx: Any) -> str | None:
        raise KeyError("nope")

    clock = FakeClock()
    raising = Lever("raises", "user", lambda ctx: None, boom, ("x()",))
    unsure = Lever("unsure", "user", bad_applies, lambda c: c, ("y()",))
    doctor = Doctor(
        _payload(), Scripted(clock, {}), 1000.0, [raising, unsure], clock=clock, log=lambda line: None
    )
    report = doctor.run()
    assert {o.name: o.verdict for o in report.levers} == {
        "raises": "failed: the lever raised RuntimeError: boom"
    }
    assert report.skipped[0]["name"] == "unsure" and "raised KeyError" in report.skipped[0]["reason"]


@pytest.mark.parametrize("name", [lever.name for lever in levers()])
def test_every_lever_failure_path_in_a_real_trial(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each lever's trial fails with out-of-memory inside the real trial code; the doctor reports it
    and goes on (the baseline and the other trials still run)."""
    (lever,) = levers([name])
    failing = lever.apply(TrialConfig())
    real = trial_module._prepare_model

    def prepare(payload: Payload, cfg: TrialConfig, device: torch.device) -> nn.Module:
        if cfg == failing:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(payload, cfg, device)

    monkeypatch.setattr(trial_module, "_prepare_model", prepare)
    payload = _payload()
    always = dataclasses.replace(lever, applies=lambda ctx: None)
    runner = in_process_runner(payload)
    doctor = Doctor(
        payload, runner, 600.0, [always], windows=2, warmup=1, window_s=0.01, log=lambda line: None
    )
    report = doctor.run()
    assert [(o.name, o.verdict) for o in report.levers] == [(name, "failed: out of memory")]
    assert report.baseline.samples_per_s and report.baseline.samples_per_s > 0


class TickClock:
    """Advances by ``tick`` seconds at every reading."""

    def __init__(self, tick: float) -> None:
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def test_trial_windows_with_an_injected_clock() -> None:
    payload = _payload()
    # Each clock reading advances 0.25 s. Calibration runs two steps, reads 0.25 s (past a tenth of
    # the 1 s window: stop), then reads the end: 2 steps in 0.5 s, so a window is 4 steps; each
    # window reads the clock once at its start and once at its end: 4 steps * 16 samples / 0.25 s.
    result = run_trial(payload, TrialConfig(), Plan(warmup=1, windows=3, window_s=1.0), clock=TickClock(0.25))
    assert result.ok, result.error
    assert result.steps_per_window == 4
    assert result.samples_per_s == [256.0, 256.0, 256.0]
    assert len(result.losses) == 12 and all(math.isfinite(v) for v in result.losses)
    assert result.batch_size == 16 and result.warmup_s == pytest.approx(0.25)


def test_trial_with_data_measures_the_wait() -> None:
    x, y = models.digits_batch(64)
    payload = _payload(data=torch.utils.data.TensorDataset(x, y))
    result = run_trial(payload, TrialConfig(batch_scale=2), Plan(warmup=1, windows=2, steps_per_window=2))
    assert result.ok, result.error
    assert result.batch_size == 32 and result.data_wait_ms is not None and result.data_wait_ms >= 0


def test_scaled_batch_keeps_the_loss() -> None:
    model = models.tiny_convnet().eval()
    x, y = models.digits_batch(8)
    x2, y2 = scaled_batch((x, y), 3)
    assert x2.shape[0] == 24 and torch.equal(x2[8:16], x)
    loss = nn.functional.cross_entropy(model(x), y)
    torch.testing.assert_close(nn.functional.cross_entropy(model(x2), y2), loss)


def test_default_blocks() -> None:
    assert default_blocks(models.tiny_convnet())[:2] == ("blocks.0", "blocks.1")
    seq = nn.Sequential(nn.Linear(2, 2), nn.GELU(), nn.Linear(2, 2))
    assert default_blocks(seq) == ("0", "2")

    class ResNetLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.layer1, self.layer2 = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)

    assert default_blocks(ResNetLike()) == ("layer1", "layer2")
    assert default_blocks(nn.Linear(2, 2)) == ()


def _alone_in_a_process(model: nn.Module, timeout_s: float) -> TrialResult:
    payload = Payload(model, (torch.randn(4, 4), torch.tensor([0, 1, 0, 1])), "cpu")
    runner = SubprocessRunner(payload)
    try:
        return runner(TrialConfig(), Plan(warmup=1, windows=1, steps_per_window=1, timeout_s=timeout_s))
    finally:
        runner.close()


def test_trial_process_crash_is_a_failed_trial() -> None:
    result = _alone_in_a_process(models.Crashes(), 120)
    assert not result.ok and result.error is not None
    assert result.error.startswith("the trial process died (SIGKILL")


def test_trial_process_past_its_timeout_is_killed() -> None:
    result = _alone_in_a_process(models.Hangs(), 8)
    assert not result.ok and result.error == "timed out after 8 s (the budget)"
    assert result.wall_s < 60


def test_argument_errors_name_the_doctor_and_the_argument() -> None:
    model, batch = models.tiny_convnet(), models.digits_batch()
    with pytest.raises(TypeError, match="fastops.doctor: model"):
        examine("resnet", batch)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fastops.doctor: example_batch"):
        examine(model, batch[0])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fastops.doctor: budget_s"):
        examine(model, batch, budget_s=0)
    with pytest.raises(ValueError, match="fastops.doctor: levers: unknown"):
        examine(model, batch, levers=["warp-drive"])
    with pytest.raises(ValueError, match="fastops.doctor: .*picklable"):
        examine(model, batch, loss_fn=lambda out, b: out.sum(), budget_s=10)
    with pytest.raises(TypeError, match="fastops.doctor: data"):
        examine(model, batch, data=[1, 2, 3])  # type: ignore[arg-type]


def _check_schema(d: dict[str, Any]) -> None:
    assert d["schema"] == SCHEMA
    assert d["rule"] == {"apply_above": 1.03, "slower_below": 0.97, "band": "p20/p80 of windows"}
    for key, kind in [
        ("device", str),
        ("budget_s", float),
        ("elapsed_s", float),
        ("batch_size", int),
        ("steps_per_window", int),
        ("windows", int),
        ("levers", list),
        ("recommended", list),
        ("code", list),
        ("skipped", list),
        ("order", list),
        ("environment", dict),
    ]:
        assert isinstance(d[key], kind), key
    rows = [d["baseline"], *d["levers"]] + ([d["combination"]] if d["combination"] else [])
    for row in rows:
        assert isinstance(row["name"], str) and isinstance(row["code"], list)
        verdict = row["verdict"]
        assert verdict in (*VERDICTS, "baseline") or verdict.startswith("failed: ")
        if not verdict.startswith("failed"):
            assert row["samples_per_s"] > 0 and row["speedup"] > 0
            low, high = row["band"]
            assert low <= row["speedup"] <= high
            assert row["peak_memory_mb"] > 0 and len(row["rates"]) >= 1
    for s in d["skipped"]:
        assert set(s) == {"name", "reason"}
    if d["profile"] is not None:
        assert set(d["profile"]["shares"]) >= {"optimizer"}
        assert isinstance(d["profile"]["top_ops"], list)


def test_json_schema_and_files(tmp_path: Path) -> None:
    clock = FakeClock()
    runner = Scripted(clock, {"amp-bf16": 1.5, "channels-last": 0.5}, fail={"fused-adamw": "out of memory"})
    report = _doctor(runner, clock, ["amp-bf16", "channels-last", "fused-adamw", "amp-fp16"]).run()
    paths = report.write(tmp_path)
    assert [p.name for p in paths] == ["doctor.md", "doctor.json", "doctor.png"]
    d = json.loads((tmp_path / "doctor.json").read_text())
    _check_schema(d)
    assert (tmp_path / "doctor.png").stat().st_size > 1000
    assert "| lever | samples/s |" in (tmp_path / "doctor.md").read_text()


def test_real_run_of_the_bundled_convnet(tmp_path: Path) -> None:
    """fastops.train's digits convnet, each trial in its own process (examine()'s runner), two
    levers, short windows; examine() itself runs in the command-line test below."""
    budget = 90.0
    payload = _payload()
    runner = SubprocessRunner(payload)
    try:
        chosen = levers(["channels-last", "checkpointing"])
        doctor = Doctor(
            payload, runner, budget, chosen, windows=3, warmup=1, window_s=0.2, log=lambda line: None
        )
        report = doctor.run()
    finally:
        runner.close()
    report.write(tmp_path)
    assert report.elapsed_s <= budget + 5  # a process start of slack past the last timeout
    assert {o.name for o in report.levers} | {s["name"] for s in report.skipped} >= {
        "channels-last",
        "checkpointing",
    }
    for o in report.levers:
        assert o.verdict in VERDICTS or o.verdict.startswith("failed: "), o.verdict
    checkpointing = next(o for o in report.levers if o.name == "checkpointing")
    # Peak RSS on the CPU: the saving of an 8x8 model can drown in the allocator's noise, and the
    # note says so rather than a negative saving.
    assert not checkpointing.failed
    assert "saves" in checkpointing.note or "no saving measured" in checkpointing.note
    assert report.profile is not None and report.profile["top_ops"]
    assert report.profile["shares"]["pytorch_kernels"] > 0
    _check_schema(json.loads((tmp_path / "doctor.json").read_text()))


def test_real_run_of_a_users_model_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """python -m fastops.doctor on a user's factory (--model package.module:factory), synthetic data."""
    argv = ["--model", "tests.train.user_models:small_mlp", "--data", "synthetic", "--image-size", "8"]
    argv += ["--batch-size", "8", "--levers", "fused-adamw", "--budget", "45", "--threads", "1"]
    assert main([*argv, "--out-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # The lever is measured, or (on a loaded machine, where the baseline took longer) skipped with
    # the budget as the reason: either way in the report.
    assert "| baseline |" in out and ("| fused-adamw |" in out or "fused-adamw (budget" in out)
    d = json.loads((tmp_path / "doctor.json").read_text())
    _check_schema(d)
    assert d["batch_size"] == 8 and d["elapsed_s"] <= 50


def test_examine_with_a_users_loss_and_optimizer_skips_the_adam_levers() -> None:
    clock = FakeClock()
    payload = Payload(models.Regressor(), (torch.randn(8, 12), torch.randn(8)), "cpu", models.mse, models.sgd)
    doctor = Doctor(
        payload, Scripted(clock, {}), 1000.0, levers(["fused-adamw", "channels-last"]), clock=clock
    )
    report = doctor.run()
    reasons = {s["name"]: s["reason"] for s in report.skipped}
    assert reasons == {
        "fused-adamw": "the optimizer is SGD, not Adam or AdamW",
        "channels-last": "the inputs are not 4-D images",
    }


def test_cli_errors_name_the_doctor(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--model", "nope"])
    assert e.value.code == 2
    assert "fastops.doctor: --model must be" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--budget", "-1"])
    assert "fastops.doctor: --budget" in capsys.readouterr().err


def test_checkpointing_memory_note() -> None:
    from fastops.doctor.examine import _memory_note

    base = TrialResult(ok=True, peak_memory_mb=500.0, memory_before_mb=300.0, batch_size=64)
    # Activations 200 MB -> 100 MB: twice the batch fits in the baseline's peak.
    less = TrialResult(ok=True, peak_memory_mb=400.0, memory_before_mb=300.0, batch_size=64)
    assert _memory_note(less, base) == "saves 100 MB, ~batch 128 in the baseline's memory"
    more = TrialResult(ok=True, peak_memory_mb=540.0, memory_before_mb=300.0, batch_size=64)
    assert _memory_note(more, base) == "peak 40 MB higher, no saving measured"
