"""fastops.tuner: the measured kernel choice, with an injected fake timer so every decision is
deterministic (the real clock is used once, to show it measures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import fastops
from fastops import _env, policy, tuner
from fastops.nn.batch_norm import BatchNorm2d
from fastops.nn.depthwise_conv2d import DepthwiseConv2d
from fastops.nn.gelu import GELU
from tests.helpers import devices

REPO = Path(__file__).resolve().parents[1]


class FakeTimer:
    """Seconds per call by path, from ``times`` (or ``times_for(x_shape)``); runs each fn once so that
    the side effects of timing happen as they would, and counts the kinds of input it timed."""

    def __init__(self, fastops_s: float, torch_s: float) -> None:
        self.times = {"fastops": fastops_s, "torch": torch_s}
        self.calls = 0

    def __call__(self, path: str, fn: Callable[[], None], reps: int) -> float:
        fn()
        self.calls += 1
        return self.times[path]


@pytest.fixture(autouse=True)
def tuned(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Modules as users get them (conftest makes every module run ours), with a cache of the test's
    own, no shipped table, nothing in memory and the counters reset."""
    monkeypatch.delenv(policy.BACKEND_ENV, raising=False)
    monkeypatch.delenv(tuner.TUNE_ENV, raising=False)
    monkeypatch.setenv(tuner.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(tuner, "SHIPPED_DIR", tmp_path / "shipped")
    tuner.clear_memory()
    policy.reset_fallback_counts()
    yield tmp_path
    tuner.clear_memory()
    policy.reset_fallback_counts()


def _measure_once(fastops_s: float, torch_s: float, x: Tensor | None = None) -> tuple[GELU, FakeTimer]:
    timer = FakeTimer(fastops_s, torch_s)
    m = GELU()
    with tuner.use_timer(timer):
        m(torch.randn(4, 8) if x is None else x)
    return m, timer


@pytest.mark.parametrize(
    ("fastops_s", "torch_s", "runs_torch"),
    [(1.0, 1.5, False), (1.0, 1.01, True), (1.0, 1.0 * (1 + tuner.MARGIN), False), (1.5, 1.0, True)],
)
def test_the_faster_kernel_wins_and_ours_needs_the_margin(
    fastops_s: float, torch_s: float, runs_torch: bool
) -> None:
    m, _ = _measure_once(fastops_s, torch_s)
    assert policy.fallback_counts()["gelu"] == int(runs_torch)
    (record,) = m.__dict__[policy.STATE_ATTR].records.values()
    assert record.choice is runs_torch and record.source == "measured"
    assert record.entry["fastops_us"] == pytest.approx(fastops_s * 1e6)
    assert 0 < tuner.MARGIN <= 0.03


def test_a_close_call_is_timed_three_times_as_long() -> None:
    _, clear = _measure_once(1.0, 2.0)
    tuner.clear_memory()
    _, close = _measure_once(1.0, 1.03, torch.randn(5, 8))
    # two calibration calls each, then rounds of two: three times the rounds when it is close
    assert close.calls - 2 == 3 * (clear.calls - 2)


def test_a_choice_is_timed_once_and_remembered() -> None:
    m, timer = _measure_once(1.0, 2.0)
    timed = timer.calls
    assert timed >= 2 + 2 * 3  # two calibration calls, then at least three interleaved rounds
    x = torch.randn(4, 8)
    with tuner.use_timer(timer):
        for _ in range(3):
            torch.testing.assert_close(m(x), F.gelu(x))
    assert timer.calls == timed
    assert len(m.__dict__[policy.STATE_ATTR].memo) == 1


@pytest.mark.parametrize(
    "change",
    ["dtype", "shape", "layout", "training", "threads", "autocast", "deterministic"],
)
def test_every_part_of_the_key_makes_a_new_kind_of_input(change: str) -> None:
    m = DepthwiseConv2d(4, 3, padding=1)
    m.requires_grad_(False)
    x = torch.randn(2, 4, 6, 6)
    timer = FakeTimer(1.0, 2.0)
    with tuner.use_timer(timer), torch.no_grad():
        m(x)
        m(x.clone())  # the same kind of input: not timed again
    once = timer.calls
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        with tuner.use_timer(timer):
            if change == "dtype":
                with torch.no_grad():
                    m.double()(x.double())
            elif change == "shape":
                with torch.no_grad():
                    m(torch.randn(2, 4, 7, 6))
            elif change == "layout":
                with torch.no_grad():
                    m(x.contiguous(memory_format=torch.channels_last))
            elif change == "training":
                m(x.requires_grad_())
            elif change == "threads":
                torch.set_num_threads(threads + 1)
                with torch.no_grad():
                    m(x)
            elif change == "autocast":
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    m(x)
            else:
                torch.use_deterministic_algorithms(True)
                with torch.no_grad():
                    m(x)
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    assert timer.calls > once
    assert len(m.__dict__[policy.STATE_ATTR].records) == 2


def test_choices_persist_on_disk_for_the_next_process(tuned: Path) -> None:
    x = torch.randn(4, 8)
    _measure_once(1.0, 2.0, x)
    path = tuner.cache_file()
    assert path.parent == tuned / "cache" and path.is_file()
    data = json.loads(path.read_text())
    assert data["fingerprint"] == tuner.fingerprint()
    assert {"cpu", "isa", "torch", "cuda", "cudnn", "fastops", "library"} <= set(data["fingerprint"])
    tuner.clear_memory()  # as a new process
    m, timer = _measure_once(5.0, 1.0, x)  # the cache answers: not timed, ours as measured before
    assert timer.calls == 0 and policy.fallback_counts()["gelu"] == 0
    (record,) = m.__dict__[policy.STATE_ATTR].records.values()
    assert record.source == "cache"


@pytest.mark.parametrize("field", ["library", "torch", "cpu", "isa"])
def test_another_build_or_machine_never_reuses_a_choice(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(4, 8)
    _measure_once(1.0, 2.0, x)
    first = tuner.cache_file()
    tuner.clear_memory()
    monkeypatch.setitem(tuner._FINGERPRINT, field, "something else")
    assert tuner.cache_file() != first
    _, timer = _measure_once(2.0, 1.0, x)
    assert timer.calls > 0 and policy.fallback_counts()["gelu"] == 1


def test_a_damaged_cache_file_is_ignored_once_and_rewritten() -> None:
    path = tuner.cache_file()
    path.parent.mkdir(parents=True)
    path.write_text('{"fingerprint": {"torch": "0.1"}, "entr')
    with pytest.warns(tuner.TuningNotice, match="damaged or foreign"):
        _, timer = _measure_once(1.0, 2.0)
    assert timer.calls > 0
    data = json.loads(path.read_text())
    assert data["fingerprint"] == tuner.fingerprint() and len(data["entries"]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _measure_once(1.0, 2.0, torch.randn(3, 3))  # no second warning


def test_a_foreign_cache_file_is_not_used() -> None:
    path = tuner.cache_file()
    path.parent.mkdir(parents=True)
    foreign = {**tuner.fingerprint(), "cpu": "another CPU"}
    path.write_text(json.dumps({"fingerprint": foreign, "entries": []}))
    with pytest.warns(tuner.TuningNotice, match="another machine or build"):
        _measure_once(1.0, 2.0)
    assert json.loads(path.read_text())["fingerprint"] == tuner.fingerprint()


def test_concurrent_writers_never_leave_a_broken_file(tuned: Path) -> None:
    """Two processes add 150 choices each to one cache file at once; the file parses at every
    moment it is read, and ends with every choice of the last writer at least."""
    script = textwrap.dedent(
        """
        import sys, fastops
        from fastops import tuner
        tag = sys.argv[1]
        for i in range(150):
            key = ("gelu", tag, "cpu", 1, "float32", (i,), (1,), False, "", False)
            tuner.CACHE.put(key, {"choice": "fastops", "fastops_us": 1.0, "torch_us": 2.0})
        """
    )
    env = {**os.environ, tuner.CACHE_ENV: str(tuned / "cache"), "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", script, tag], env=env) for tag in ("a", "b")]
    path = tuner.cache_file()
    reads = 0
    while any(w.poll() is None for w in writers):
        if path.is_file():
            json.loads(path.read_text())  # never half-written
            reads += 1
    assert all(w.wait(timeout=120) == 0 for w in writers)
    entries = json.loads(path.read_text())["entries"]
    tags = {e["key"]["details"] for e in entries}
    assert len(entries) >= 150 and tags <= {"a", "b"}
    assert not list(path.parent.glob("*.tmp"))


def test_a_module_stops_tuning_after_the_cap_and_says_so_once() -> None:
    m = GELU()
    timer = FakeTimer(1.0, 2.0)
    measured = tuner.stats().measured
    with tuner.use_timer(timer), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, tuner.MAX_SIGNATURES + 4):
            m(torch.randn(n))
    notices = [w for w in caught if issubclass(w.category, tuner.TuningNotice)]
    assert len(notices) == 1 and f"tuned {tuner.MAX_SIGNATURES} kinds of input" in str(notices[0].message)
    assert tuner.stats().measured - measured == tuner.MAX_SIGNATURES
    assert policy.fallback_counts()["gelu"] == 3  # the three past the cap run PyTorch's kernel


class _RandomTwin(policy.TunedModule):
    """Both paths draw from the RNG, as a module with dropout would."""

    policy_ops = ("gelu",)

    def _fastops_forward(self, x: Tensor) -> Tensor:
        return x * (1 + 0 * torch.rand(()))

    def _torch_forward(self, x: Tensor) -> Tensor:
        return x * (1 + 0 * torch.rand(()))


def test_timing_leaves_no_trace_on_module_rng_grads_or_graph() -> None:
    torch.manual_seed(0)
    ours, stock = BatchNorm2d(4, momentum=None), nn.BatchNorm2d(4, momentum=None)
    x = torch.randn(3, 4, 5, 5)
    x_ours, x_stock = x.clone().requires_grad_(), x.clone().requires_grad_()
    h_ours, h_stock = x_ours * 2, x_stock * 2  # a graph before the module
    torch.manual_seed(1)
    # x was drawn right after manual_seed(0): the tuner's upstream gradient must not be that draw
    # too (the input gradient is then zero, and two kernels' rounding noise would disagree).
    with tuner.use_timer(FakeTimer(1.0, 2.0)), warnings.catch_warnings():
        warnings.simplefilter("error", tuner.TuningNotice)
        y = ours(h_ours)
    after_ours = torch.rand(3)
    torch.manual_seed(1)
    y_stock = stock(h_stock)
    after_stock = torch.rand(3)
    assert torch.equal(after_ours, after_stock)  # RNG state as if the call ran once
    assert int(ours.num_batches_tracked) == 1
    torch.testing.assert_close(ours.running_mean, stock.running_mean)
    torch.testing.assert_close(ours.running_var, stock.running_var)
    assert ours.weight.grad is None and ours.bias.grad is None and x_ours.grad is None
    y.pow(2).sum().backward()
    y_stock.pow(2).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_stock.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours.weight.grad, stock.weight.grad, rtol=1e-4, atol=1e-5)

    twin = _RandomTwin()
    torch.manual_seed(2)
    with tuner.use_timer(FakeTimer(1.0, 2.0)):
        twin(torch.ones(2))
    after = torch.rand(2)
    torch.manual_seed(2)
    torch.rand(())  # the one draw of one call
    assert torch.equal(after, torch.rand(2))


class _Nondeterministic(_RandomTwin):
    def fastops_deterministic(self, device_type: str) -> bool:
        return False


class _TorchRaises(_RandomTwin):
    def _torch_forward(self, x: Tensor) -> Tensor:
        raise RuntimeError("no deterministic implementation")


def test_deterministic_mode_keeps_only_deterministic_candidates() -> None:
    timer = FakeTimer(1.0, 2.0)
    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with tuner.use_timer(timer):
            m = _Nondeterministic()
            m(torch.ones(2))
            assert timer.calls == 0 and policy.fallback_counts()["gelu"] == 1
            (record,) = m.__dict__[policy.STATE_ATTR].records.values()
            assert record.source == "default: deterministic mode"
            m2 = _TorchRaises()
            m2(torch.ones(2))
            (record,) = m2.__dict__[policy.STATE_ATTR].records.values()
            assert not record.choice and "PyTorch's kernel raised" in record.entry["why"]
    finally:
        torch.use_deterministic_algorithms(saved)


class _Broken(_RandomTwin):
    def _fastops_forward(self, x: Tensor) -> Tensor:
        return x + 1


def test_a_kernel_that_disagrees_with_pytorch_is_not_chosen() -> None:
    m = _Broken()
    with tuner.use_timer(FakeTimer(1.0, 100.0)), pytest.warns(tuner.TuningNotice, match="disagreed"):
        y = m(torch.ones(3))
    assert torch.equal(y, torch.ones(3))
    (record,) = m.__dict__[policy.STATE_ATTR].records.values()
    assert record.choice and record.entry["why"] == "outputs disagreed"


def test_under_autocast_fp32_outputs_are_judged_at_half_precision() -> None:
    """PyTorch's SE block under bf16 autocast runs its FCs in bf16 inside an fp32 result (0.2-0.5%
    off ours, which keeps them in fp32): the same computation, so ours stays a candidate."""
    from fastops.nn import SqueezeExcite

    m = SqueezeExcite(16, 8, act="relu", gate="sigmoid", conv=True)
    x = torch.randn(16, 16, 32, 32).contiguous(memory_format=torch.channels_last).requires_grad_()
    with tuner.use_timer(FakeTimer(1.0, 2.0)), torch.autocast("cpu", dtype=torch.bfloat16):
        m(x)
    (record,) = m.__dict__[policy.STATE_ATTR].records.values()
    assert not record.choice and "why" not in record.entry


def test_where_pytorch_rounds_and_ours_is_closer_to_float64_ours_stays_a_candidate() -> None:
    """A bf16 SE block whose hardsigmoid gate inputs sit on its corner (3): PyTorch's bf16 FC
    rounds them all onto it, so its weight gradients are zero, while ours (fp32 inside) gives the
    float64 computation's. The outputs differ by PyTorch's rounding, not a broken kernel: no
    notice, and both are timed."""
    from fastops.nn import SqueezeExcite

    torch.manual_seed(0)
    m = SqueezeExcite(96, 24, act="relu", gate="hardsigmoid")
    with torch.no_grad():
        m.fc2.bias.fill_(3.0)
        m.fc2.weight.mul_(0.05)
    m = m.to(torch.bfloat16)
    x = torch.randn(16, 96, 14, 14, dtype=torch.bfloat16, requires_grad=True)
    with tuner.use_timer(FakeTimer(1.0, 2.0)), warnings.catch_warnings():
        warnings.simplefilter("error", tuner.TuningNotice)
        m(x)
    (record,) = m.__dict__[policy.STATE_ATTR].records.values()
    assert not record.choice and "why" not in record.entry


def test_our_error_reaches_the_caller_and_nothing_is_cached() -> None:
    m = DepthwiseConv2d(4, 3, padding=1)
    with tuner.use_timer(FakeTimer(1.0, 2.0)), pytest.raises(ValueError, match=r"fastops\.depthwise_conv2d"):
        m(torch.randn(2, 5, 6, 6))  # 5 channels for a 4-channel conv
    assert not tuner.CACHE.all_entries()


class _OursRefuses(_RandomTwin):
    def _fastops_forward(self, x: Tensor) -> Tensor:
        raise RuntimeError("fastops.gelu: expected x to be float32, got a dtype it has no kernel for")


def test_what_pytorch_takes_and_ours_refuses_runs_pytorch() -> None:
    """As the module it replaced: a kind of input only PyTorch's kernel takes (float64 on CUDA, say)
    runs PyTorch's, as a counted fallback that says why."""
    m = _OursRefuses()
    with tuner.use_timer(FakeTimer(1.0, 2.0)):
        assert torch.equal(m(torch.ones(3)), torch.ones(3))
    (record,) = m.__dict__[policy.STATE_ATTR].records.values()
    assert record.choice and "fastops' kernel raised RuntimeError: fastops.gelu" in record.entry["why"]
    assert policy.fallback_counts()["gelu"] == 1


def test_the_meta_device_times_nothing() -> None:
    """Shape-only calls (meta-device init, FLOP counters) run through without timing anything."""
    timer = FakeTimer(1.0, 2.0)
    with tuner.use_timer(timer):
        y = DepthwiseConv2d(4, 3, padding=1, device="meta")(torch.randn(2, 4, 6, 6, device="meta"))
        z = GELU()(torch.randn(3, device="meta"))
    assert y.shape == (2, 4, 6, 6) and y.is_meta and z.is_meta and timer.calls == 0
    assert not tuner.CACHE.all_entries()


def test_backend_and_environment_override_the_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    m = GELU()
    timer = FakeTimer(1.0, 2.0)
    x = torch.randn(5)
    with tuner.use_timer(timer):
        m.backend = "torch"
        m(x)
        m.backend = "fastops"
        m(x)
        m.backend = "auto"
        monkeypatch.setenv(policy.BACKEND_ENV, "torch")
        m(x)
        monkeypatch.setenv(policy.BACKEND_ENV, "cudnn")
        with pytest.raises(ValueError, match=r"nn.GELU: FASTOPS_BACKEND='cudnn'; expected one of"):
            m(x)
        monkeypatch.delenv(policy.BACKEND_ENV)
        m.backend = "fast"
        with pytest.raises(ValueError, match=r"nn.GELU: expected backend to be one of .*'fast'"):
            m(x)
    assert timer.calls == 0 and not policy.fallback_counts()  # forced choices are no fallback


def test_tune_off_uses_the_cache_else_pytorch(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(4, 8)
    _measure_once(1.0, 2.0, x)  # cached: ours
    tuner.clear_memory()
    monkeypatch.setenv(tuner.TUNE_ENV, "0")
    timer = FakeTimer(1.0, 2.0)
    m = GELU()
    with tuner.use_timer(timer):
        m(x)
        assert policy.fallback_counts()["gelu"] == 0
        with pytest.warns(tuner.TuningNotice, match="FASTOPS_TUNE=0"):
            m(torch.randn(9))
    assert timer.calls == 0 and policy.fallback_counts()["gelu"] == 1


def test_a_shipped_table_is_used_only_on_its_own_machine(tuned: Path) -> None:
    def key_of(shape: tuple[int, ...]) -> tuple[object, ...]:
        threads = torch.get_num_threads()
        return ("gelu", "approximate='none'", "cpu", threads, "float32", shape, (1,), False, "", False)

    table = {
        "fingerprint": {**tuner.fingerprint(), "library": "another build of this version"},
        "entries": [{"key": tuner._key_to_json(key_of((7,))), "entry": {"choice": "torch"}}],
    }
    (tuned / "shipped").mkdir()
    (tuned / "shipped" / "this_machine.json").write_text(json.dumps(table))
    elsewhere = {**table, "fingerprint": {**table["fingerprint"], "cpu": "another CPU"}}
    elsewhere["entries"] = [{"key": tuner._key_to_json(key_of((8,))), "entry": {"choice": "torch"}}]
    (tuned / "shipped" / "elsewhere.json").write_text(json.dumps(elsewhere))
    timer = FakeTimer(1.0, 2.0)
    m = GELU()
    with torch.no_grad(), tuner.use_timer(timer):
        m(torch.randn(7))
        assert timer.calls == 0 and policy.fallback_counts()["gelu"] == 1
        m(torch.randn(8))
    assert timer.calls > 0 and policy.fallback_counts()["gelu"] == 1


def _graph_ops(compiled_fn: Callable[[], Tensor]) -> set[str]:
    from torch._dynamo.testing import CompileCounterWithBackend

    backend = CompileCounterWithBackend("eager")
    torch._dynamo.reset()
    try:
        torch.compile(compiled_fn, backend=backend, fullgraph=True)()
    finally:
        torch._dynamo.reset()
    return {str(node.target) for graph in backend.graphs for node in graph.graph.nodes}


def test_compile_uses_the_eager_choice_and_holds_no_tuner_code() -> None:
    x = torch.randn(4, 8)
    torch_side, timer = _measure_once(1.0, 2.0, x)  # ours measured faster
    ops = _graph_ops(lambda: torch_side(x))
    assert any("fastops.gelu" in op for op in ops) and not any("tuner" in op for op in ops)
    assert not any("gelu" in op and "fastops" not in op for op in ops)
    x2 = torch.randn(5, 8)
    slow_side, _ = _measure_once(2.0, 1.0, x2)  # a module that measured PyTorch's faster
    ops = _graph_ops(lambda: slow_side(x2))
    assert not any("fastops" in op for op in ops) and any("gelu" in op for op in ops)


def test_compile_without_a_choice_runs_pytorch_and_names_tune() -> None:
    m = GELU()
    timer = FakeTimer(1.0, 2.0)
    x = torch.randn(6, 5)
    with tuner.use_timer(timer), pytest.warns(tuner.TuningNotice, match=r"fastops\.tune"):
        ops = _graph_ops(lambda: m(x))
    assert timer.calls == 0 and not any("fastops" in op for op in ops)
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), F.gelu(x))
    torch._dynamo.reset()


def test_tune_measures_ahead_and_leaves_the_model_as_it_was() -> None:
    model = nn.Sequential(
        nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.GELU(), nn.Conv2d(4, 4, 3, padding=1, groups=4)
    )
    report = fastops.swap_modules(model)
    assert len(report) == 3
    model.eval()
    x = torch.randn(2, 3, 6, 6)
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    timer = FakeTimer(1.0, 2.0)
    with tuner.use_timer(timer):
        table = fastops.tune(model, x)
    assert [row.module for row in table.rows] == ["1", "2", "3"]
    assert {row.choice for row in table.rows} == {"fastops"} and table.measured == 3
    assert "training" in table.rows[0].kind and "fastops 1000000.0 us" in str(table)
    assert not model.training and all(not m.training for m in model.modules())
    for k, v in model.state_dict().items():
        assert torch.equal(v, state_before[k]), k
    assert all(p.grad is None for p in model.parameters())
    calls = timer.calls
    with tuner.use_timer(timer):
        model.train()
        model(x).sum().backward()  # the tuned kinds of input: nothing timed
        assert timer.calls == calls
        again = fastops.tune(model, x)
    assert again.measured == 0 and {row.source for row in again.rows} == {"cache"}


def test_report_and_info_show_the_choices_in_words() -> None:
    model = nn.Sequential(nn.GELU())
    report = fastops.swap_modules(model)
    assert "no choice cached on this machine yet" in str(report)
    with tuner.use_timer(FakeTimer(2.0, 1.0)), torch.no_grad():
        model(torch.randn(3, 5))
    text = str(report)
    assert "gelu: 1 kind(s) of input tuned; fastops' kernel on 0, PyTorch's on 1" in text
    assert "PyTorch's for gelu (approximate='none') on cpu, float32 [3, 5], inference" in text
    from fastops import info

    assert "gelu: 1 kind(s) of input tuned" in info.report()
    assert str(tuner.cache_dir()) not in info.report()


@devices
def test_the_real_clock_measures(device: str) -> None:
    m = GELU()
    x = torch.randn(64, 256, device=device)
    with torch.no_grad():
        m(x)
    (record,) = m.__dict__[policy.STATE_ATTR].records.values()
    assert record.entry["fastops_us"] > 0 and record.entry["torch_us"] > 0
    assert tuner.stats().seconds > 0


def test_environment_is_checked_at_import() -> None:
    _env.check({"FASTOPS_BACKEND": "auto", "FASTOPS_TUNE": "0", "FASTOPS_JIT": "1"})
    with pytest.raises(ValueError, match=r"FASTOPS_TUNE='yes'.*expected one of \['0', '1'\]"):
        _env.check({"FASTOPS_TUNE": "yes"})
    with pytest.raises(ValueError, match=r"FASTOPS_CUDA_DEPTHWISE='fastops' is removed.*FASTOPS_BACKEND"):
        _env.check({"FASTOPS_CUDA_DEPTHWISE": "fastops"})
    with pytest.raises(ValueError, match=r"FASTOPS_NCHW_WIDE='0' is removed: an A/B switch"):
        _env.check({"FASTOPS_NCHW_WIDE": "0"})
    with pytest.warns(UserWarning, match="unknown environment variable FASTOPS_BAKCEND"):
        _env.check({"FASTOPS_BAKCEND": "torch"})
    env = {**os.environ, "FASTOPS_BACKEND": "garbage", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", "import fastops"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0
    assert "fastops: FASTOPS_BACKEND='garbage'" in done.stderr and "expected one of" in done.stderr


_GLOO_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch, torch.distributed as dist
    from torch import nn
    import fastops
    from fastops import tuner

    class Timer:
        def __init__(self, times): self.times = times
        def __call__(self, path, fn, reps):
            fn()
            return self.times[path]

    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=__import__("datetime").timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 8), nn.GELU())
        fastops.swap_modules(model)
        # rank 0 measures PyTorch's kernel faster, rank 1 ours
        times = {"fastops": 2.0, "torch": 1.0} if rank == 0 else {"fastops": 1.0, "torch": 2.0}
        with tuner.use_timer(Timer(times)):
            table = fastops.tune(model, torch.randn(4, 8))
            fastops.policy.reset_fallback_counts()
            model(torch.randn(4, 8))
        result = {"choices": [r.choice for r in table.rows], "sources": [r.source for r in table.rows],
                  "fallbacks": dict(fastops.policy.fallback_counts())}
        with open(sys.argv[4] + f".{rank}", "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()
    """
)


def test_two_gloo_processes_adopt_rank0s_choices(tuned: Path) -> None:
    init = f"file://{tuned / 'rendezvous'}"
    out = tuned / "result"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(policy.BACKEND_ENV, None)
    # A cache each: the ranks' fake clocks disagree on purpose, and with one shared cache the rank that
    # saves first would hand its measurement to the other (as it should, on one real machine).
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _GLOO_SCRIPT, str(r), "2", init, str(out)],
            env={**env, tuner.CACHE_ENV: str(tuned / f"cache{r}")},
        )
        for r in range(2)
    ]
    assert [p.wait(timeout=240) for p in ranks] == [0, 0]
    results = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    assert results[0]["choices"] == results[1]["choices"] == ["torch"]
    assert results[0]["sources"] == ["measured"] and results[1]["sources"] == ["rank 0"]
    assert results[0]["fallbacks"] == results[1]["fallbacks"] == {"bias_gelu": 1}


class _LayoutRecorder(policy.TunedModule):
    """Records the strides of the upstream gradient each path's backward receives."""

    policy_ops = ("gelu",)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def _record(self, y: Tensor) -> Tensor:
        if y.requires_grad:
            y.register_hook(lambda g: self.seen.append(g.is_contiguous(memory_format=torch.channels_last)))
        return y

    def _fastops_forward(self, x: Tensor) -> Tensor:
        return self._record(x * 2)

    def _torch_forward(self, x: Tensor) -> Tensor:
        return self._record(x * 2)


def test_timed_backwards_get_an_upstream_laid_out_as_the_output() -> None:
    """A channels_last output gets a channels_last upstream gradient, as the next layer of a
    channels_last model hands back: given a plain contiguous one, our channels_last depthwise
    backward measured ~6x slower than in training, and the tuner chose PyTorch's kernel there."""
    m = _LayoutRecorder()
    x = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last).requires_grad_()
    with tuner.use_timer(FakeTimer(1.0, 2.0)):
        m(x)
    assert m.seen and all(m.seen)


class SequenceTimer:
    """Seconds per call from a list per path, in call order (runs each fn once)."""

    def __init__(self, fastops_s: list[float], torch_s: list[float]) -> None:
        self.times = {"fastops": list(fastops_s), "torch": list(torch_s)}

    def __call__(self, path: str, fn: Callable[[], None], reps: int) -> float:
        fn()
        return self.times[path].pop(0)


def test_a_noisy_measurement_whose_two_estimates_disagree_keeps_torch() -> None:
    """Round ratios 1.1, 1.1, 0.1 (median 1.1: ours) but medians 2 s ours against 1.1 s PyTorch's:
    the measurement cannot tell, and the module keeps the kernel it replaced."""
    m = GELU()
    # the single-call timings first, then three rounds (fastops first, torch first, fastops first)
    with tuner.use_timer(SequenceTimer([1.0, 1.0, 2.0, 10.0], [1.0, 1.1, 2.2, 1.0])):
        m(torch.randn(8))
    (record,) = m.__dict__[policy.STATE_ATTR].records.values()
    assert record.choice is True and record.entry["fastops_us"] == 2e6 and record.entry["torch_us"] == 1.1e6
    m2 = GELU()
    with tuner.use_timer(SequenceTimer([1.0, 1.0, 2.0, 1.0], [1.0, 1.1, 2.2, 1.1])):
        m2(torch.randn(9))  # another kind of input: not the first one's cached choice
    (record,) = m2.__dict__[policy.STATE_ATTR].records.values()
    assert record.choice is False  # both say ours: 1.1x per round, medians 1 s against 1.1 s


# ---- the remembered choice's C path (csrc/tuner.cpp run_<op>) ------------------------------------


def _tuned_module(name: str) -> tuple[nn.Module, Tensor, Callable[[Tensor], Tensor]]:
    """A module of each kind with the run_<op> fast path, its input, and PyTorch's expression."""
    from fastops.nn.clipped_log import ClippedLog
    from fastops.nn.gelu import BiasGELU

    x = torch.randn(2, 4, 5, 6)
    if name == "gelu":
        m: nn.Module = GELU("tanh")
        return m, x, lambda t: F.gelu(t, approximate="tanh")
    if name == "bias_gelu":
        m = BiasGELU(6)
        with torch.no_grad():
            m.bias.uniform_()
        return m, x, lambda t: F.gelu(t + m.bias)
    if name == "clipped_log":
        m = ClippedLog(0.1)
        return m, x, lambda t: torch.log(t.clamp(min=0.1))
    m = DepthwiseConv2d(4, 3, stride=2, padding=1)
    return m, x, lambda t: F.conv2d(t, m.weight, m.bias, 2, 1, 1, 4)


class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    """The ops that reach the dispatcher's Python key (fastops' and aten's)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["gelu", "bias_gelu", "clipped_log", "depthwise_conv2d"])
def test_a_remembered_choice_of_ours_runs_the_op_without_the_python_path(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    m, x, expected = _tuned_module(name)
    with torch.no_grad(), tuner.use_timer(FakeTimer(1.0, 2.0)):
        m(x)  # measured: ours
    python_path = {"calls": 0}

    def counted(*args: object) -> bool:
        python_path["calls"] += 1
        return False

    monkeypatch.setattr(policy, "_decide", counted)
    monkeypatch.setattr(policy, "_cached_choice", lambda *args: python_path.__setitem__("calls", 99))
    with torch.no_grad(), _OpLog() as log:
        y = m(x)
    torch.testing.assert_close(y, expected(x))
    assert log.ops == [f"fastops.{name}.default"] and python_path["calls"] == 0
    assert policy.fallback_counts()[name] == 0


def test_the_c_path_keeps_autograd_and_autocast() -> None:
    m, x, expected = _tuned_module("bias_gelu")
    leaf = x.clone().requires_grad_(True)
    with tuner.use_timer(FakeTimer(1.0, 2.0)):
        m(leaf)  # measured: ours, for a differentiated call
    y = m(leaf)
    assert "BiasGeluFunction" in y.grad_fn.name()  # fastops' C++ autograd recorded the call
    (gx, gb), (ex, eb) = (torch.autograd.grad(f(leaf).sum(), (leaf, m.bias)) for f in (m, expected))
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gb, eb)
    log, x, _ = _tuned_module("clipped_log")
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16), tuner.use_timer(FakeTimer(1.0, 2.0)):
        log(x.bfloat16())  # measured: ours, under autocast
        assert log(x.bfloat16()).dtype == torch.float32  # clipped_log's autocast rule: float32, as log


def test_a_remembered_choice_of_pytorch_counts_one_fallback_per_call() -> None:
    m, x, expected = _tuned_module("gelu")
    with torch.no_grad(), tuner.use_timer(FakeTimer(2.0, 1.0)):
        m(x)  # measured: PyTorch's
        for _ in range(3):
            torch.testing.assert_close(m(x), expected(x))
    assert policy.fallback_counts()["gelu"] == 4


def test_a_torch_function_mode_or_subclass_sees_the_op_as_torch_ops_shows_it() -> None:
    """The C path takes plain Tensors only: a __torch_function__ mode or Tensor subclass is called
    exactly as when the module calls torch.ops itself."""
    m, x, expected = _tuned_module("gelu")
    with torch.no_grad(), tuner.use_timer(FakeTimer(1.0, 2.0)):
        m(x)

    class Seen(torch.overrides.TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.funcs: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.funcs.append(str(func))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), Seen() as seen:
        torch.testing.assert_close(m(x), expected(x))
    assert "fastops.gelu.default" in seen.funcs

    class Marked(Tensor):
        calls = 0

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            cls.calls += 1
            return super().__torch_function__(func, types, args, kwargs or {})

    with torch.no_grad():
        m(x.as_subclass(Marked))
    assert Marked.calls > 0


def test_a_same_padding_conv_keeps_its_padding_once_its_choice_is_remembered() -> None:
    from fastops.nn.depthwise_conv2d import DepthwiseConv2dSame, tf_same_padding

    m = DepthwiseConv2dSame(4, 3, stride=2)
    x = torch.randn(2, 4, 7, 8)
    top, bottom, left, right = tf_same_padding(x.shape[2:], (3, 3), (2, 2), (1, 1))
    expected = F.conv2d(F.pad(x, (left, right, top, bottom)), m.weight, m.bias, 2, groups=4)
    with torch.no_grad(), tuner.use_timer(FakeTimer(1.0, 2.0)):
        for _ in range(2):  # measured (ours), then remembered
            torch.testing.assert_close(m(x), expected)
