"""examine(): the baseline, each lever alone between baselines, then the best combination, profiled.

The order of a run, within the budget:

1. the baseline (the model as given, fp32, contiguous, the baseline optimizer, cudnn.benchmark
   off), whose timed steps set how many steps a window has for every trial;
2. each applicable lever alone, in the registry's order (cheap, likely levers first; compile, batch
   size and the allocator last), with the baseline again after every BRACKET levers and once at
   the end; each lever is compared with the windows of the baselines just before and after it, so
   a machine whose load drifts during the run widens the band instead of favouring the levers
   tried early or late. A lever whose trial no longer fits the budget is skipped and listed;
3. the combination of the best "apply" lever of each group, with one profiled step, compared with
   the last two baselines.

Every trial has the budget left as its timeout, so the run cannot overshoot it by more than a
process start.
"""

from __future__ import annotations

import copy
import functools
import platform
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

import fastops
from fastops.doctor import levers as lever_registry
from fastops.doctor.levers import Context, Lever, TrialConfig, code_lines
from fastops.doctor.report import Outcome, Report, loss_problem, rank, speedup_band, verdict
from fastops.doctor.trial import (
    Clock,
    OptimizerFactory,
    Payload,
    Plan,
    Runner,
    SubprocessRunner,
    TrialResult,
    failure_reason,
)
from fastops.train.cli import _load_average, busy_machine_note
from fastops.train.loop import LossFn

# The default budget, by device: on the CPU a step of EfficientNet-B0 at 224 px takes ~0.4-4 s and
# torch.compile minutes, so the CPU gets more; a GPU step is milliseconds.
DEFAULT_BUDGET_S = {"cpu": 900.0, "cuda": 600.0}
WINDOWS = 5
MARGIN = 1.25  # a trial's estimated wall time, times this, must fit in what is left
BRACKET = 3  # levers between two baseline runs
WARMUP = 3


def default_blocks(model: nn.Module) -> tuple[str, ...]:
    """The model's top-level blocks, the units of the checkpointing lever: timm's ``stages`` or
    ``blocks``, ``layers``/``features``, torchvision ResNets' ``layer1..N``, or the children of a
    plain nn.Sequential; () when none is found."""
    for attr in ("stages", "blocks", "layers", "features"):
        seq = getattr(model, attr, None)
        if isinstance(seq, (nn.Sequential, nn.ModuleList)) and len(seq) > 1:
            return tuple(f"{attr}.{i}" for i in range(len(seq)))
    layers = tuple(n for n, _ in model.named_children() if re.fullmatch(r"layer\d+", n))
    if layers:
        return layers
    if isinstance(model, nn.Sequential) and len(model) > 2:
        return tuple(n for n, m in model.named_children() if any(True for _ in m.parameters()))
    return ()


def environment(device: torch.device, threads: int = 0) -> dict[str, str]:
    """Versions and the machine, for the report; ``threads``: the trials' (0: torch's default)."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    env = {
        "torch": torch.__version__,
        "fastops": fastops.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "threads": str(threads or torch.get_num_threads()),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


@dataclass
class Doctor:
    """The run of :func:`examine`, with its parts injectable: ``runner`` runs one trial (default: a
    spawned process each), ``clock`` measures the budget. ``log`` gets one line per trial."""

    payload: Payload
    runner: Runner
    budget_s: float
    levers: Sequence[Lever]
    clock: Clock = time.perf_counter
    windows: int = WINDOWS
    warmup: int = WARMUP
    window_s: float | None = None  # seconds per timed window; default from the budget
    log: Callable[[str], None] = print
    skipped: list[dict[str, str]] = field(default_factory=list)
    loads: dict[str, dict[str, Any]] = field(default_factory=dict)

    def context(self) -> Context:
        model, batch = self.payload.model, self.payload.example_batch
        trial = copy.deepcopy(model)
        factory = self.payload.optimizer_factory or (lambda ps: torch.optim.AdamW(ps, lr=1e-3))
        try:
            optimizer = factory([p for p in trial.parameters() if p.requires_grad])
        except Exception as e:
            raise ValueError(
                f"fastops.doctor: optimizer_factory failed on the model's parameters: {e}"
            ) from e
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                "fastops.doctor: optimizer_factory must return a torch.optim.Optimizer, got "
                f"{type(optimizer).__name__}"
            )
        inputs = batch[0]
        return Context(
            device=torch.device(self.payload.device),
            input_dims=inputs.dim() if isinstance(inputs, Tensor) else 0,
            has_data=self.payload.data is not None,
            optimizer_class=type(optimizer),
            blocks=self.payload.blocks,
            swappable=len(fastops.swap_modules(trial)),
        )

    def _trial(self, name: str, cfg: TrialConfig, plan: Plan) -> TrialResult:
        """One trial, with the machine's load average around it (for the busy-machine note)."""
        before = _load_average()
        result = self.runner(cfg, plan)
        if before is not None:
            self.loads[f"{name} {len(self.loads) + 1}"] = {"load_avg": (before, _load_average() or before)}
        return result

    def _load_range(self) -> dict[str, dict[str, Any]]:
        """The lowest and highest load average seen around the trials, for busy_machine_note."""
        seen = [v for entry in self.loads.values() for v in entry["load_avg"]]
        return {"trials": {"load_avg": (min(seen), max(seen))}} if seen else {}

    def _left(self, start: float) -> float:
        return self.budget_s - (self.clock() - start)

    def _skip(self, name: str, reason: str) -> None:
        self.skipped.append({"name": name, "reason": reason})

    def run(self) -> Report:
        start = self.clock()
        ctx = self.context()
        todo: list[Lever] = []
        for lever in self.levers:
            try:
                reason = lever.applies(ctx)
            except Exception as e:  # a lever of the user's that breaks is reported, not raised
                reason = f"its applies() raised {failure_reason(e)}"
            if reason is None:
                todo.append(lever)
            else:
                self._skip(lever.name, reason)
        # Each trial's timed part gets a share of the budget; the rest goes to process starts,
        # warm-ups and compilation.
        trials = len(todo) + len(todo) // BRACKET + 3
        window_s = self.window_s or min(5.0, max(0.2, 0.4 * self.budget_s / trials / self.windows))
        plan = Plan(warmup=self.warmup, windows=self.windows, window_s=window_s, timeout_s=self.budget_s)
        first = self._trial("baseline", TrialConfig(), plan)
        if not first.ok:
            raise RuntimeError(f"fastops.doctor: the baseline trial itself failed: {first.error}")
        self.log(f"baseline: {_median(first.samples_per_s):.1f} samples/s ({first.wall_s:.1f} s)")
        plan = replace(plan, steps_per_window=first.steps_per_window)
        base_wall = MARGIN * first.wall_s
        reserve = 2 * base_wall  # the last baseline and the combination

        # Trials in sequence; a baseline after every BRACKET levers, so each lever is compared with
        # the baselines just before and after it, not with one measured minutes away on a machine
        # whose load has changed since (seen: the same baseline at 346 and 605 samples/s).
        baselines: list[tuple[int, TrialResult]] = [(0, first)]
        results: list[tuple[Lever, TrialResult, int]] = []
        out_of_memory: set[str] = set()
        since = 0
        for lever in todo:
            if lever.group in out_of_memory and lever.group == "batch size":
                self._skip(lever.name, "a smaller batch already ran out of memory")
                continue
            bracket = base_wall if since >= BRACKET else 0.0
            estimate = first.wall_s * lever.cost + lever.extra_s
            left = self._left(start) - reserve
            if estimate + bracket > left:
                self._skip(
                    lever.name, f"budget: needs ~{estimate:.0f} s, {max(left - bracket, 0):.0f} s left"
                )
                continue
            if bracket:
                self._baseline(baselines, len(results) + len(baselines), plan, self._left(start) - reserve)
                since = 0
            try:
                cfg = lever.apply(TrialConfig())
            except Exception as e:
                result = TrialResult(ok=False, error=f"the lever raised {failure_reason(e)}")
            else:
                left = self._left(start) - reserve
                result = self._trial(lever.name, cfg, replace(plan, timeout_s=max(left, 1.0)))
            if result.error == "out of memory":
                out_of_memory.add(lever.group)
            results.append((lever, result, len(results) + len(baselines)))
            since += 1
            self.log(
                f"{lever.name}: "
                + (
                    f"{_median(result.samples_per_s):.1f} samples/s"
                    if result.ok
                    else f"failed: {result.error}"
                )
            )

        # Which levers the last bracket would combine: the closing baseline's timeout leaves room
        # for their combination, worth more than the closing baseline if one must give way.
        provisional = self._best_per_group(
            [self._outcome(lv, r, first, _bracket(baselines, pos)) for lv, r, pos in results]
        )
        kept = base_wall if provisional else 0.0
        closing: TrialResult | None = None
        if results and self._left(start) - kept >= base_wall:
            closing = self._baseline(
                baselines,
                len(results) + len(baselines),
                replace(plan, profile=True),
                self._left(start) - kept,
            )
        elif results:
            self._skip("baseline (closing run)", "budget, kept for the combination")
        outcomes = [self._outcome(lv, r, first, _bracket(baselines, pos)) for lv, r, pos in results]
        all_rates = [rate for _, b in baselines for rate in b.samples_per_s]
        baseline = self._outcome_of_baseline(first, all_rates)

        chosen = self._best_per_group(outcomes)
        combination: Outcome | None = None
        profile, profile_of = (closing.profile, "the baseline") if closing else (None, "")
        if chosen:
            cfg = TrialConfig()
            for lever in chosen:
                cfg = cfg.merged(lever.apply(TrialConfig()))
            left = self._left(start)
            name = " + ".join(lever.name for lever in chosen)
            if left >= first.wall_s * max(lever.cost for lever in chosen):
                combo = self._trial("combination", cfg, replace(plan, profile=True, timeout_s=max(left, 1.0)))
                combined = Lever(
                    name, "combination", lambda c: None, lambda c: cfg, tuple(code_lines(chosen))
                )
                # Against the last two baselines, the ones nearest in time.
                recent = [rate for _, b in baselines[-2:] for rate in b.samples_per_s]
                combination = self._outcome(combined, combo, first, recent)
                if combo.ok and combo.profile:
                    profile, profile_of = combo.profile, "the combination"
            else:
                self._skip(f"combination ({name})", "budget")
        recommended = self._recommend(outcomes, chosen, combination)
        return Report(
            device=self.payload.device,
            budget_s=self.budget_s,
            elapsed_s=self.clock() - start,
            batch_size=first.batch_size,
            steps_per_window=first.steps_per_window,
            windows=self.windows,
            baseline=baseline,
            levers=rank(outcomes),
            combination=combination,
            recommended=[lever.name for lever in recommended],
            code=code_lines(recommended),
            skipped=self.skipped,
            order=[lever.name for lever in todo],
            profile=profile,
            profile_of=profile_of,
            environment=environment(torch.device(self.payload.device), self.payload.threads),
            busy=busy_machine_note(self._load_range()),
            baseline_runs=len(baselines),
        )

    def _baseline(
        self, baselines: list[tuple[int, TrialResult]], position: int, plan: Plan, timeout: float
    ) -> TrialResult:
        """A bracketing baseline trial at ``position`` in the sequence; kept when it succeeds."""
        result = self._trial("baseline", TrialConfig(), replace(plan, timeout_s=max(timeout, 1.0)))
        if result.ok:
            baselines.append((position, result))
        else:
            self._skip(f"baseline (run {len(baselines) + 1})", f"failed: {result.error}")
        return result

    def _outcome_of_baseline(self, first: TrialResult, rates: list[float]) -> Outcome:
        band = speedup_band(rates, rates)
        return Outcome(
            "baseline",
            "baseline",
            "baseline",
            samples_per_s=_median(rates),
            speedup=1.0,
            band=(band.low, band.high),
            peak_memory_mb=first.peak_memory_mb,
            batch_size=first.batch_size,
            data_wait_ms=first.data_wait_ms,
            rates=rates,
            wall_s=first.wall_s,
        )

    def _outcome(self, lever: Lever, r: TrialResult, first: TrialResult, base_rates: list[float]) -> Outcome:
        out = Outcome(lever.name, lever.group, "", code=list(lever.code), wall_s=r.wall_s)
        if not r.ok:
            out.verdict = f"failed: {r.error}"
            return out
        # A larger batch of real data legitimately lowers the loss: only a rise counts there.
        one_sided = lever.group in ("batch size", "combination") and self.payload.data is not None
        problem = loss_problem(r.losses, first.losses, one_sided=one_sided)
        band = speedup_band(r.samples_per_s, base_rates)
        out.samples_per_s, out.speedup, out.band = (
            _median(r.samples_per_s),
            band.speedup,
            (band.low, band.high),
        )
        out.peak_memory_mb, out.batch_size, out.data_wait_ms = r.peak_memory_mb, r.batch_size, r.data_wait_ms
        out.rates = r.samples_per_s
        out.verdict = f"failed: {problem}" if problem else verdict(band)
        notes = []
        if lever.memory_lever and r.peak_memory_mb is not None and first.peak_memory_mb is not None:
            notes.append(_memory_note(r, first))
        if r.data_wait_ms is not None and first.data_wait_ms is not None:
            notes.append(f"waits {r.data_wait_ms:.1f} ms/step for data, baseline {first.data_wait_ms:.1f}")
        if r.batch_size != first.batch_size:
            notes.append(f"batch {r.batch_size}")
        out.note = "; ".join(notes)
        return out

    @staticmethod
    def _best_per_group(outcomes: Sequence[Outcome]) -> list[Lever]:
        """The fastest "apply" lever of each group, in trial order."""
        best: dict[str, Outcome] = {}
        for o in outcomes:
            if o.verdict == "apply" and (
                o.group not in best or (o.speedup or 0) > (best[o.group].speedup or 0)
            ):
                best[o.group] = o
        names = {o.name for o in best.values()}
        return [lever for lever in lever_registry.levers() if lever.name in names]

    @staticmethod
    def _recommend(
        outcomes: Sequence[Outcome], chosen: list[Lever], combination: Outcome | None
    ) -> list[Lever]:
        """The combination when it measured "apply" and at least as fast as the best single lever;
        else the best single "apply" lever; else nothing."""
        applied = [o for o in outcomes if o.verdict == "apply"]
        if not applied:
            return []
        best = max(applied, key=lambda o: o.speedup or 0.0)
        if (
            combination is not None
            and combination.verdict == "apply"
            and (combination.speedup or 0) >= (best.speedup or 0)
        ):
            return chosen
        return [lever for lever in lever_registry.levers() if lever.name == best.name]


def _bracket(baselines: Sequence[tuple[int, TrialResult]], position: int) -> list[float]:
    """The windows of the baselines just before and just after ``position`` in the sequence."""
    before = [b for pos, b in baselines if pos < position][-1:]
    after = [b for pos, b in baselines if pos > position][:1]
    return [rate for b in before + after for rate in b.samples_per_s]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _memory_note(r: TrialResult, first: TrialResult) -> str:
    """Memory saved, and the batch that would fit in the baseline's peak: activations scale with the
    batch, what was resident before the first step (weights, the interpreter) does not."""
    saved = (first.peak_memory_mb or 0) - (r.peak_memory_mb or 0)
    before = first.memory_before_mb or 0
    base_act = (first.peak_memory_mb or 0) - before
    act = (r.peak_memory_mb or 0) - (r.memory_before_mb or before)
    note = f"saves {saved:.0f} MB" if saved >= 0 else f"peak {-saved:.0f} MB higher, no saving measured"
    if act > 0 and base_act > act:
        note += f", ~batch {int(first.batch_size * base_act / act)} in the baseline's memory"
    return note


def _check_batch(example_batch: Any) -> tuple[Any, ...]:
    if not isinstance(example_batch, (tuple, list)) or not example_batch:
        raise TypeError(
            "fastops.doctor: example_batch must be an (inputs, targets, ...) tuple, as fastops.train's "
            f"batches are, got {type(example_batch).__name__}"
        )
    if not isinstance(example_batch[0], Tensor) or example_batch[0].dim() == 0:
        raise TypeError("fastops.doctor: example_batch[0] (the model's inputs) must be a batched tensor")
    return tuple(t.detach().cpu() if isinstance(t, Tensor) else t for t in example_batch)


def examine(
    model: nn.Module,
    example_batch: Sequence[Any],
    *,
    loss_fn: LossFn | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    data: Dataset | None = None,
    device: str | torch.device | None = None,
    budget_s: float | None = None,
    blocks: Sequence[str] | None = None,
    levers: Sequence[str] | None = None,
    threads: int = 0,
    out_dir: str | Path | None = None,
    verbose: bool = True,
) -> Report:
    """Try the speed levers of the PyTorch guides on ``model`` and say which ones to apply.

    Each lever is measured alone, then the best of each group together, each in a short real
    training run in its own process (see :mod:`fastops.doctor`), against the baseline: the model as
    given, fp32, contiguous, ``optimizer_factory`` (default ``torch.optim.AdamW(lr=1e-3)``),
    cudnn.benchmark off.

    Args:
        model: any nn.Module; not modified (every trial trains a copy).
        example_batch: ``(inputs, targets, ...)``, as fastops.train's batches; the model is called on
            ``inputs``. Without ``data`` every step trains on it; the batch-size levers repeat it.
        loss_fn: ``loss_fn(outputs, batch)`` -> the mean loss; default cross-entropy on ``batch[1]``.
        optimizer_factory: ``optimizer_factory(params)`` -> the baseline optimizer. The optimizer
            levers (FusedAdamW, AdamW foreach / fused) take its hyperparameters when it is Adam/AdamW.
        data: a map-style Dataset of such batches' samples: trials then read it through a DataLoader
            (and the loader-workers lever applies).
        device: default CUDA when available, else the CPU.
        budget_s: seconds for the whole run; default 900 on the CPU, 600 on CUDA.
        blocks: the submodules the checkpointing lever recomputes (qualified names); default
            :func:`default_blocks`.
        levers: only these levers (names from ``fastops.doctor.levers.levers()``); default all.
        threads: CPU intra-op threads of each trial (0: torch's default, one per core).
        out_dir: where doctor.md, doctor.json and doctor.png go; default nowhere.

    The model, batch, functions and data are pickled into each trial process: define functions at
    module level. Returns the :class:`Report` (``print(report.table())``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fastops.doctor: model must be an nn.Module, got {type(model).__name__}")
    batch = _check_batch(example_batch)
    if data is not None and not isinstance(data, Dataset):
        raise TypeError(f"fastops.doctor: data must be a map-style Dataset, got {type(data).__name__}")
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"fastops.doctor: device must be cpu or cuda, got {str(dev)!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("fastops.doctor: device cuda was asked for but CUDA is not available")
    budget = DEFAULT_BUDGET_S[dev.type] if budget_s is None else float(budget_s)
    if not budget > 0:
        raise ValueError(f"fastops.doctor: budget_s must be a positive number of seconds, got {budget_s!r}")
    chosen = lever_registry.levers(levers)
    weights = copy.deepcopy(model).cpu()
    found = tuple(blocks) if blocks is not None else default_blocks(weights)
    payload = Payload(weights, batch, str(dev), loss_fn, optimizer_factory, data, found, threads=threads)
    runner = SubprocessRunner(payload)
    try:
        doctor = Doctor(
            payload,
            runner,
            budget,
            chosen,
            log=functools.partial(print, flush=True) if verbose else (lambda line: None),
        )
        report = doctor.run()
    finally:
        runner.close()
    if out_dir is not None:
        report.write(Path(out_dir))
    return report
