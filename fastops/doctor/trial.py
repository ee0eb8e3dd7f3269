"""One trial: a short real training run of the model under one :class:`TrialConfig`, timed in windows.

:func:`run_trial` is the trial itself (any failure becomes ``TrialResult(ok=False, error=...)``);
:class:`SubprocessRunner` runs each trial in a fresh spawned process, so a crash, an out-of-memory
or a hang ends that trial and not the doctor, each trial's peak memory is its own, and environment
levers (the allocator) take effect at process start, where glibc and LD_PRELOAD read them.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import pickle
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

import fastops
from fastops.doctor.levers import TrialConfig
from fastops.train import amp
from fastops.train.activation_checkpointing import checkpoint_blocks
from fastops.train.loop import Batch, LossFn, cross_entropy_loss, model_inputs, train_step
from fastops.train.metrics import peak_memory_mb

Clock = Callable[[], float]
OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


@dataclass
class Payload:
    """What every trial starts from: sent once to each trial process, so each one trains a fresh
    copy of the same initial weights on the same batches."""

    model: nn.Module
    example_batch: tuple[Any, ...]
    device: str
    loss_fn: LossFn | None = None
    optimizer_factory: OptimizerFactory | None = None
    data: Dataset | None = None
    blocks: tuple[str, ...] = ()
    seed: int = 0
    threads: int = 0  # CPU intra-op threads of each trial; 0: torch's default


@dataclass(frozen=True)
class Plan:
    """How long a trial runs: ``warmup`` untimed steps (compilation, cuDNN's search, the allocator
    filling up), then ``windows`` timed windows of ``steps_per_window`` steps (0: as many steps as
    take about ``window_s`` seconds, measured after the warm-up), then optionally one profiled step."""

    warmup: int = 3
    windows: int = 5
    steps_per_window: int = 0
    window_s: float = 1.0
    profile: bool = False
    timeout_s: float | None = None


@dataclass
class TrialResult:
    ok: bool
    error: str | None = None
    samples_per_s: list[float] = field(default_factory=list)  # one per timed window
    losses: list[float] = field(default_factory=list)  # one per timed step
    peak_memory_mb: float | None = None
    memory_before_mb: float | None = None  # peak memory before the first step (weights, inputs)
    data_wait_ms: float | None = None  # per step, waiting for the loader and the copy to the device
    warmup_s: float = 0.0
    steps_per_window: int = 0
    batch_size: int = 0
    wall_s: float = 0.0  # the whole trial, process start included (set by the runner)
    profile: dict[str, Any] | None = None


def _no_metric(outputs: Any, batch: Batch) -> Tensor:
    return torch.zeros((), device=_first_tensor(batch).device)


def _first_tensor(batch: Batch) -> Tensor:
    return next(t for t in batch if isinstance(t, Tensor))


def scaled_batch(batch: Sequence[Any], k: int) -> tuple[Any, ...]:
    """``batch`` with every tensor of the batch's leading size repeated ``k`` times along dim 0.

    Repeating (not new samples) keeps the mean loss and its gradient those of the example batch, so
    a larger batch's losses stay comparable with the baseline's.
    """
    n = len(model_inputs(batch))
    if k == 1:
        return tuple(batch)
    return tuple(
        torch.cat([t] * k) if isinstance(t, Tensor) and t.dim() and t.shape[0] == n else t for t in batch
    )


def _move(batch: Sequence[Any], device: torch.device, memory_format: torch.memory_format) -> tuple[Any, ...]:
    # Images (4-D floating tensors) in the model's memory format, as the training loop feeds them.
    def move(t: Any) -> Any:
        if not isinstance(t, Tensor):
            return t
        if t.dim() == 4 and t.is_floating_point():
            return t.to(device, non_blocking=True, memory_format=memory_format)
        return t.to(device, non_blocking=True)

    return tuple(move(t) for t in batch)


class _Batches:
    """An endless stream of training batches on the device; ``wait_s`` is the time spent waiting
    for them (the loader, the host-to-device copy)."""

    def __init__(
        self, payload: Payload, cfg: TrialConfig, device: torch.device, memory_format: torch.memory_format
    ) -> None:
        self.device, self.memory_format = device, memory_format
        self.wait_s = 0.0
        self.size = len(model_inputs(payload.example_batch)) * cfg.batch_scale
        if payload.data is None:
            # Device-resident, like fastops.train's synthetic data: the numbers are the step's.
            self.fixed: tuple[Any, ...] | None = _move(
                scaled_batch(payload.example_batch, cfg.batch_scale), device, memory_format
            )
            return
        self.fixed = None
        self.loader = DataLoader(
            payload.data,
            batch_size=self.size,
            shuffle=True,
            drop_last=True,
            generator=torch.Generator().manual_seed(payload.seed),
            num_workers=cfg.num_workers,
            pin_memory=cfg.pin_memory,
            persistent_workers=cfg.num_workers > 0,
        )
        if len(self.loader) == 0:
            raise ValueError(
                f"fastops.doctor: data has {len(payload.data)} samples, fewer than one batch of "  # type: ignore[arg-type]
                f"{self.size}"
            )
        self.it: Iterator[Any] = iter(self.loader)

    def next(self, clock: Clock) -> tuple[Any, ...]:
        if self.fixed is not None:
            return self.fixed
        start = clock()
        with torch.profiler.record_function("doctor.data"):  # the profiled step's data-loader share
            try:
                batch = next(self.it)
            except StopIteration:
                self.it = iter(self.loader)
                batch = next(self.it)
            moved = _move(batch, self.device, self.memory_format)
        self.wait_s += clock() - start
        return moved


def _optimizer(payload: Payload, model: nn.Module, kind: str) -> torch.optim.Optimizer:
    """The baseline optimizer (the user's factory, else AdamW), or an Adam-family alternative with
    the baseline's hyperparameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    factory = payload.optimizer_factory or (lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    base = factory(params)
    if kind == "baseline":
        return base
    decoupled = isinstance(base, torch.optim.AdamW)
    keys = ("params", "lr", "betas", "eps", "weight_decay", "amsgrad")
    groups = [{k: v for k, v in g.items() if k in keys} for g in base.param_groups]
    if kind == "fastops":
        from fastops.optim import FusedAdam, FusedAdamW

        return (FusedAdamW if decoupled else FusedAdam)(groups)
    cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    if kind == "foreach":
        return cls(groups, foreach=True)
    return cls(groups, fused=True)


def _prepare_model(payload: Payload, cfg: TrialConfig, device: torch.device) -> nn.Module:
    model = payload.model
    if cfg.swap:
        fastops.swap_modules(model)
    if cfg.checkpointing:
        checkpoint_blocks(model, list(payload.blocks))
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    return model.to(device, memory_format=fmt)  # type: ignore[call-overload]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_trial(
    payload: Payload, cfg: TrialConfig, plan: Plan, clock: Clock = time.perf_counter
) -> TrialResult:
    """Train ``payload.model`` (modified in place) under ``cfg`` as ``plan`` says. Never raises for a
    failure of the trial: out of memory, an error of the model or of a lever is the result's error."""
    threads = torch.get_num_threads()
    try:
        return _run(payload, cfg, plan, clock)
    except Exception as e:  # noqa: BLE001 - every failure of a lever is a verdict, not a crash
        return TrialResult(ok=False, error=failure_reason(e))
    finally:
        torch.set_num_threads(threads)  # an in-process trial leaves the caller's setting as it was


def failure_reason(e: BaseException) -> str:
    """A one-line reason: "out of memory" for any allocator failure, else the exception's first line."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text:
        return "out of memory"
    return f"{type(e).__name__}: {text}"[:300]


def _run(payload: Payload, cfg: TrialConfig, plan: Plan, clock: Clock) -> TrialResult:
    device = torch.device(payload.device)
    if payload.threads:
        torch.set_num_threads(payload.threads)
    torch.manual_seed(payload.seed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    torch.backends.cudnn.benchmark = cfg.cudnn_benchmark
    module = _prepare_model(payload, cfg, device)
    module.train()
    optimizer = _optimizer(payload, module, cfg.optimizer)
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    batches = _Batches(payload, cfg, device, fmt)
    if cfg.swap:
        # The kernel choices for this trial's inputs (device, layout, batch, AMP), measured before
        # torch.compile traces the model, as a user would (fastops.tune).
        example = _move(scaled_batch(payload.example_batch, cfg.batch_scale), device, fmt)
        with amp.autocast(cfg.amp, device):
            fastops.tune(module, model_inputs(example))
    model: nn.Module = torch.compile(module) if cfg.compile else module  # type: ignore[assignment]
    step = functools.partial(
        train_step,
        model,
        optimizer=optimizer,
        scaler=amp.make_scaler(cfg.amp, device),
        autocast=functools.partial(amp.autocast, cfg.amp, device),
        loss_fn=payload.loss_fn or cross_entropy_loss,
        metric_fn=_no_metric,
    )
    memory_before = peak_memory_mb(device)

    start = clock()
    for _ in range(plan.warmup):
        step([batches.next(clock)])
    _sync(device)
    warmup_s = clock() - start

    steps = plan.steps_per_window
    if steps <= 0:
        # Calibrate: steps until a tenth of a window has passed (at least two), so that a window of
        # sub-millisecond steps is not sized from one step's timer noise; at least two steps a window.
        start, n = clock(), 0
        while n < 2 or (clock() - start < 0.1 * plan.window_s and n < 1000):
            step([batches.next(clock)])
            _sync(device)
            n += 1
        steps = max(2, min(10_000, round(n * plan.window_s / max(clock() - start, 1e-6))))

    batches.wait_s = 0.0
    losses: list[Tensor] = []
    rates: list[float] = []
    for _ in range(plan.windows):
        start = clock()
        for _ in range(steps):
            losses.append(step([batches.next(clock)]).loss)
        _sync(device)
        rates.append(steps * batches.size / max(clock() - start, 1e-9))
    result = TrialResult(
        ok=True,
        samples_per_s=rates,
        losses=[float(v) for v in torch.stack(losses).cpu()] if losses else [],
        peak_memory_mb=peak_memory_mb(device),
        memory_before_mb=memory_before,
        data_wait_ms=1e3 * batches.wait_s / max(1, steps * plan.windows)
        if payload.data is not None
        else None,
        warmup_s=warmup_s,
        steps_per_window=steps,
        batch_size=batches.size,
    )
    if plan.profile:
        result.profile = profile_step(lambda: step([batches.next(clock)]), device)
    return result


def profile_step(step: Callable[[], Any], device: torch.device, top: int = 10) -> dict[str, Any]:
    """One step under torch.profiler: the top ops by self time, and the shares of the step spent in
    the data loader, in the optimizer, in fastops kernels and in PyTorch (aten) kernels.

    The optimizer's share is what ``torch.optim.Optimizer`` records as ``Optimizer.step#...``;
    kernels are ops by their namespace (``fastops::``, ``aten::``) at their self time, on the GPU
    their device time.
    """
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        with record_function("doctor.step"):
            step()
        _sync(device)
    events = prof.key_averages()

    def self_us(e: Any) -> float:
        return float(e.self_device_time_total if cuda else e.self_cpu_time_total)

    total_us = next((e.cpu_time_total for e in events if e.key == "doctor.step"), 0.0) or 1.0
    if cuda:
        total_us = sum(self_us(e) for e in events) or 1.0
    data_us = sum(e.cpu_time_total for e in events if e.key == "doctor.data")
    optimizer_us = sum(e.cpu_time_total for e in events if e.key.startswith("Optimizer.step#"))
    fastops_us = sum(self_us(e) for e in events if e.key.startswith("fastops::"))
    aten_us = sum(self_us(e) for e in events if e.key.startswith("aten::"))
    ops = sorted(
        (e for e in events if "::" in e.key and self_us(e) > 0), key=lambda e: self_us(e), reverse=True
    )
    return {
        "step_ms": total_us / 1e3,
        "time": "device" if cuda else "cpu",
        "shares": {
            "data_loader": data_us / total_us,
            "optimizer": optimizer_us / total_us,
            "fastops_kernels": fastops_us / total_us,
            "pytorch_kernels": aten_us / total_us,
        },
        "top_ops": [
            {
                "name": e.key,
                "self_ms": self_us(e) / 1e3,
                "calls": int(e.count),
                "share": self_us(e) / total_us,
            }
            for e in ops[:top]
        ],
    }


# ------------------------------------------------------------------ the trial processes
Runner = Callable[[TrialConfig, Plan], TrialResult]


def in_process_runner(payload: Payload, clock: Clock = time.perf_counter) -> Runner:
    """Trials in this process on fresh copies of the payload (tests: an injected clock, no spawn;
    environment levers have no effect here)."""

    def run(cfg: TrialConfig, plan: Plan) -> TrialResult:
        fresh = pickle.loads(pickle.dumps(payload))
        start = clock()
        result = run_trial(fresh, cfg, plan, clock)
        result.wall_s = clock() - start
        return result

    return run


def _child(payload_path: str, cfg: TrialConfig, plan: Plan, result_path: str) -> None:
    payload = torch.load(payload_path, weights_only=False)
    result = run_trial(payload, cfg, plan)
    tmp = result_path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, result_path)  # whole or absent: a killed trial leaves no half result


@contextmanager
def _environment(extra: Sequence[tuple[str, str]]) -> Iterator[None]:
    """``extra`` in os.environ while a trial process starts (spawn passes the environment on)."""
    saved = {k: os.environ.get(k) for k, _ in extra}
    os.environ.update(dict(extra))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SubprocessRunner:
    """Each trial in a fresh spawned process (CUDA cannot be forked; and an environment lever
    must be in place before the interpreter starts)."""

    def __init__(self, payload: Payload, workdir: Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="fastops-doctor-", dir=workdir)
        self.dir = Path(self._tmp.name)
        self.payload_path = self.dir / "payload.pt"
        try:
            torch.save(payload, self.payload_path)
        except (pickle.PicklingError, AttributeError, TypeError) as e:
            raise ValueError(
                "fastops.doctor: the model, example_batch, loss_fn, optimizer_factory and data are sent "
                f"to each trial process and must be picklable ({e}); define functions at module level, "
                "not as lambdas or local functions"
            ) from None
        self.count = 0

    def __call__(self, cfg: TrialConfig, plan: Plan) -> TrialResult:
        self.count += 1
        result_path = self.dir / f"trial{self.count}.pkl"
        ctx = mp.get_context("spawn")
        proc = ctx.Process(target=_child, args=(str(self.payload_path), cfg, plan, str(result_path)))
        start = time.perf_counter()
        with _environment(cfg.env):
            proc.start()
        proc.join(plan.timeout_s)
        if proc.is_alive():
            proc.kill()
            proc.join()
            result = TrialResult(ok=False, error=f"timed out after {plan.timeout_s:.0f} s (the budget)")
        elif result_path.is_file():
            with open(result_path, "rb") as f:
                result = pickle.load(f)
        else:
            result = TrialResult(ok=False, error=f"the trial process died ({_exit_reason(proc.exitcode)})")
        result.wall_s = time.perf_counter() - start
        return result

    def close(self) -> None:
        self._tmp.cleanup()


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"{name}; killed by the system if it ran out of memory" if name == "SIGKILL" else name
    return f"exit code {code}"
