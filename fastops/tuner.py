"""The kernel-choice tuner: which kernel a fastops module runs, measured on this machine.

The first time a module (under ``backend="auto"``) sees a new kind of input, the tuner times our
kernel against PyTorch's for it (the forward, or forward + backward when autograd will differentiate
the call), interleaved and repeated (three times the rounds for a close call), and keeps ours only
when the median of the rounds' paired speedups is at least 1 + :data:`MARGIN`, so that noise does
not flip a choice to the slower kernel. The two outputs are also
compared: a kernel that disagrees with PyTorch's is not chosen (and a warning asks for a report).

A kind of input is everything that can change which kernel is faster: the op and its parameters,
the device (GPU name and compute capability), the CPU thread count, dtype, shape and strides,
training or inference, the autocast dtype and deterministic mode; and, for the whole cache, the CPU
model, the vector ISA of our kernels, the torch / CUDA / cuDNN versions, the fastops version and a
hash of the built library, so that another machine or build never reuses a choice. Choices are kept
in memory and in ``$FASTOPS_CACHE_DIR`` (default ``~/.cache/fastops``), one JSON file per machine
and build, written by atomic replace (two processes writing at once leave a whole file).

Timing has no side effects: module buffers (BatchNorm running statistics, ``num_batches_tracked``)
and the RNG state are restored, gradients are taken with ``torch.autograd.grad`` (no ``.grad``
changes) from a detached input (the caller's autograd graph is untouched), and the call then runs
once as usual. PyTorch's side is warmed up (cuDNN plans) before it is timed.

Where nothing may be timed:

* ``FASTOPS_TUNE=0``: the cache, else PyTorch's kernel (never slower than stock);
* inside a ``torch.compile`` trace: the choice this module made in eager calls (or
  :func:`fastops.tune`) for that op, dtype, layout and training mode, else the cache, else a shipped
  table measured on exactly this device and versions, else PyTorch's kernel, with one notice naming
  :func:`fastops.tune`; the compiled graph holds only the chosen kernel;
* during a CUDA graph capture: the cache, else PyTorch's kernel;
* after :data:`MAX_SIGNATURES` kinds of input in one module (dynamic shapes): the cache, else
  PyTorch's kernel, with one notice.

Under DDP/FSDP no collective runs inside a forward: ranks tune on their own (both kernels compute
the same thing within the op's tolerance) or agree ahead of the run through
:func:`tune`, which broadcasts rank 0's choices.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import json
import os
import platform
import statistics
import tempfile
import threading
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from fastops._version import __version__

_UPSTREAM_SEED = 0x5EED_FA57  # the tuner's own seed for upstream gradients, unlike any user's
MARGIN = 0.02  # ours is kept only when at least 2% faster than PyTorch's
MAX_SIGNATURES = 16  # kinds of input one module tunes; later ones use the cache or PyTorch's kernel
TUNE_ENV = "FASTOPS_TUNE"
CACHE_ENV = "FASTOPS_CACHE_DIR"
CACHE_FORMAT = 1
SHIPPED_DIR = Path(__file__).resolve().parent / "kernel_choices"  # tables measured on named machines

# seconds per call of ``fn`` run ``reps`` times; ``path`` ("fastops" or "torch") lets a test fake it.
Timer = Callable[[str, Callable[[], None], int], float]

Key = tuple[Any, ...]  # (op, details, device, threads, dtype, shape, strides, training, autocast, det)
_KEY_FIELDS = (
    "op",
    "details",
    "device",
    "threads",
    "dtype",
    "shape",
    "strides",
    "training",
    "autocast",
    "deterministic",
)


STATE_ATTR = "_fastops_tuning"  # a module's TuningState, in its __dict__

_FALLBACKS: Counter[str] = Counter()  # module calls that ran PyTorch's kernel, by op (fallback_counts)


class Tunable(nn.Module):
    """What the tuner times: a module with two kernels for one computation, ours and PyTorch's
    (``fastops.policy.TunedModule`` adds the forward that runs the chosen one).

    ``fastops_op()`` names the op and ``fastops_details()`` the parameters that can change which
    kernel is faster (kernel size, stride, GELU form); ``_fastops_forward(x)`` and
    ``_torch_forward(x)`` are the two kernels."""

    backend: str = "auto"
    policy_ops: tuple[str, ...] = ()  # the ops whose kernel choices this module follows

    def fastops_op(self) -> str:
        return self.policy_ops[0]

    def fastops_details(self) -> str:
        return ""

    def fastops_deterministic(self, device_type: str) -> bool:
        """Whether our kernels for this module are deterministic on ``device_type`` (all are today:
        fixed-order reductions, no atomics); under ``torch.use_deterministic_algorithms(True)`` a
        non-deterministic kernel is not a candidate."""
        return True

    def _fastops_forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _torch_forward(self, x: Tensor) -> Tensor:
        raise NotImplementedError


def _compiled() -> Any:
    from fastops import _extension

    module = _extension.load().module
    assert module is not None, "fastops._C was loaded without its Python module"
    return module


def _call_signature(x: object, params: tuple[Tensor, ...] | None) -> int | None:
    """The 64-bit key of a call (csrc/tuner.cpp); bound to the compiled function on first use."""
    globals()["_call_signature"] = _compiled().call_signature
    return _compiled().call_signature(x, params)


def differentiated(x: Tensor, params: tuple[Tensor, ...] | None) -> bool:
    """Whether autograd will differentiate a call on ``x`` of a module holding ``params``: the
    "training" part of a kind of input (forward + backward is what gets timed then)."""
    return torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params or ()))


class TuningNotice(UserWarning):
    """A one-time notice of the tuner: a choice it could not measure, or a disagreement."""


@dataclass
class Record:
    key: Key
    choice: bool  # True: PyTorch's kernel
    entry: dict[str, Any]
    source: str  # "measured", "cache", "shipped", "default: <why>"
    remember: bool = True  # False: good for this call only (a CUDA graph capture), decide again later


@dataclass
class TuningState:
    """What one module has decided: ``memo`` maps the 64-bit call key (csrc/tuner.cpp) to True
    (PyTorch's kernel) or False (ours); ``records`` the kinds of input behind it."""

    op: str
    details: str
    params: tuple[Tensor, ...] | None
    memo: dict[int, bool] = field(default_factory=dict)
    records: dict[Key, Record] = field(default_factory=dict)
    capped: bool = False


@dataclass
class Stats:
    measured: int = 0
    seconds: float = 0.0


_LOCK = threading.RLock()
_STATS = Stats()
_MODULES: weakref.WeakValueDictionary[int, nn.Module] = weakref.WeakValueDictionary()
_NOTICES: set[str] = set()
_FORCE_TUNING = threading.local()  # set by tune(): timing on whatever FASTOPS_TUNE says
_TUNE_LOG: list[list[tuple[str, nn.Module, Record]]] = []  # open tune() calls collect records here


def _notice(key: str, message: str) -> None:
    if key not in _NOTICES:
        _NOTICES.add(key)
        warnings.warn(message, TuningNotice, stacklevel=4)


def tuning_enabled() -> bool:
    if getattr(_FORCE_TUNING, "on", False):
        return True
    return os.environ.get(TUNE_ENV, "1").strip() != "0"


def stats() -> Stats:
    """How many kinds of input were timed in this process, and the seconds that took."""
    return Stats(_STATS.measured, _STATS.seconds)


# ---- the machine and build a cache belongs to -------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "CPU part")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


_FINGERPRINT: dict[str, str] = {}


def fingerprint() -> dict[str, str]:
    """What a cache file belongs to: another CPU, ISA level, version or build never reuses it."""
    if not _FINGERPRINT:
        from fastops import _extension

        ext = _extension.load()
        digest = hashlib.sha256()
        try:
            with open(ext.path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            library = digest.hexdigest()[:16]
        except OSError:
            library = "unknown"
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        _FINGERPRINT.update(
            format=str(CACHE_FORMAT),
            cpu=_cpu_model(),
            isa=ext.cpu_capability,
            torch=torch.__version__,
            cuda=str(torch.version.cuda),
            cudnn=str(cudnn),
            fastops=__version__,
            library=library,
        )
    return dict(_FINGERPRINT)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fastops")


def cache_file() -> Path:
    name = hashlib.sha256(json.dumps(fingerprint(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"kernel-choices-{name}.json"


# ---- the cache: memory, disk, shipped tables --------------------------------------------------


def _key_to_json(key: Key) -> dict[str, Any]:
    return {name: list(v) if isinstance(v, tuple) else v for name, v in zip(_KEY_FIELDS, key, strict=True)}


def _key_from_json(data: dict[str, Any]) -> Key:
    return tuple(tuple(data[n]) if isinstance(data[n], list) else data[n] for n in _KEY_FIELDS)


class _Cache:
    """The measured choices of this machine and build, loaded from disk on first use."""

    def __init__(self) -> None:
        self.entries: dict[Key, dict[str, Any]] = {}
        self.loaded_from: Path | None = None
        self.shipped: dict[Key, dict[str, Any]] | None = None

    def _read(self, path: Path) -> dict[Key, dict[str, Any]] | None:
        """The entries of a cache file of this machine and build; None (with one warning) for a
        damaged or foreign file, {} for none."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as error:
            _notice(
                f"read:{path}", f"fastops tuner: cannot read the kernel-choice cache ({error}); ignoring it"
            )
            return None
        try:
            data = json.loads(text)
            if data.get("fingerprint") != fingerprint():
                raise ValueError("it belongs to another machine or build")
            return {_key_from_json(e["key"]): e["entry"] for e in data["entries"]}
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            _notice(
                f"damaged:{path}",
                f"fastops tuner: ignoring a damaged or foreign kernel-choice cache file ({error}); "
                "it will be rewritten",
            )
            return None

    def load(self) -> None:
        path = cache_file()
        if self.loaded_from == path:
            return
        self.entries = self._read(path) or {}
        self.loaded_from = path

    def get(self, key: Key) -> dict[str, Any] | None:
        self.load()
        return self.entries.get(key)

    def put(self, key: Key, entry: dict[str, Any]) -> None:
        self.load()
        self.entries[key] = entry
        self.save()

    def save(self) -> None:
        """Merge with what other processes wrote since, then replace the file atomically."""
        path = cache_file()
        on_disk = self._read(path) or {}
        merged = {**on_disk, **self.entries}
        self.entries = merged
        payload = {
            "fingerprint": fingerprint(),
            "entries": [{"key": _key_to_json(k), "entry": e} for k, e in merged.items()],
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump(payload, f, indent=1)
            os.replace(tmp, path)
        except OSError as error:
            _notice(
                f"write:{path}",
                f"fastops tuner: cannot write the kernel-choice cache ({error}); choices stay in memory",
            )

    def shipped_entries(self) -> dict[Key, dict[str, Any]]:
        """The tables shipped with fastops, used only on exactly the machine and versions they were
        measured on (everything in the fingerprint but the library's hash)."""
        if self.shipped is None:
            self.shipped = {}
            mine = {k: v for k, v in fingerprint().items() if k != "library"}
            for path in sorted(SHIPPED_DIR.glob("*.json")) if SHIPPED_DIR.is_dir() else []:
                try:
                    data = json.loads(path.read_text())
                    theirs = {k: v for k, v in data["fingerprint"].items() if k != "library"}
                    if theirs == mine:
                        self.shipped.update({_key_from_json(e["key"]): e["entry"] for e in data["entries"]})
                except (OSError, ValueError, KeyError, TypeError):
                    continue
        return self.shipped

    def all_entries(self) -> dict[Key, dict[str, Any]]:
        self.load()
        return dict(self.entries)


CACHE = _Cache()


def clear_memory() -> None:
    """Forget every choice held in memory (the disk cache stays): for tests and benchmarks."""
    with _LOCK:
        CACHE.entries.clear()
        CACHE.loaded_from = None
        CACHE.shipped = None
        _NOTICES.clear()
        for module in list(_MODULES.values()):
            module.__dict__.pop(STATE_ATTR, None)


# ---- deciding ---------------------------------------------------------------------------------


def _device_name(x: Tensor) -> str:
    if x.is_cuda:
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda:{torch.cuda.get_device_name(index)}:sm_{major}{minor}"
    return x.device.type


def _key(state: TuningState, x: Tensor, training: bool) -> Key:
    device_type = x.device.type
    autocast = (
        str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")
        if device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type)
        else ""
    )
    return (
        state.op,
        state.details,
        _device_name(x),
        torch.get_num_threads() if x.is_cpu else 0,
        str(x.dtype).removeprefix("torch."),
        tuple(x.shape),
        tuple(x.stride()),
        training,
        autocast,
        torch.are_deterministic_algorithms_enabled(),
    )


def describe_key(key: Key) -> str:
    """A kind of input in words: "gelu (approximate='none') on cpu, float32 [64, 3072], training"."""
    op, details, device, threads, dtype, shape, strides, training, autocast, deterministic = key
    contiguous = _contiguous_strides(shape)
    layout = (
        ""
        if tuple(strides) == contiguous
        else ", channels_last"
        if len(shape) == 4 and tuple(strides) == _channels_last_strides(shape)
        else f", strides {list(strides)}"
    )
    words = [
        f"{op}{f' ({details})' if details else ''} on {device}",
        f"{dtype} {list(shape)}{layout}",
        "training" if training else "inference",
    ]
    if threads:
        words.append(f"{threads} thread{'s' if threads != 1 else ''}")
    if autocast:
        words.append(f"autocast {autocast}")
    if deterministic:
        words.append("deterministic")
    return ", ".join(words)


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, running = [], 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def _channels_last_strides(shape: Sequence[int]) -> tuple[int, ...]:
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _state(module: Tunable) -> TuningState:
    state = module.__dict__.get(STATE_ATTR)
    if state is None:
        params = tuple(module.parameters())
        state = TuningState(module.fastops_op(), module.fastops_details(), params or None)
        module.__dict__[STATE_ATTR] = state
        _MODULES[id(module)] = module
    return state


def decide(module: Tunable, x: Tensor) -> bool:
    """The slow path of :func:`fastops.policy.runs_torch`: the choice for a kind of input this
    module has not seen, from the cache or measured now; True means PyTorch's kernel."""
    if not isinstance(x, Tensor):
        return False  # our op names what it expected
    if x.device.type == "meta":
        return False  # shapes only (meta-device init, FLOP counters): nothing to time; our meta kernel
    with _LOCK:
        state = _state(module)
        signature = _call_signature(x, state.params)
        training = differentiated(x, state.params)
        key = _key(state, x, training)
        record = state.records.get(key)
        if record is None:
            record = _lookup_or_measure(module, state, x, key, training)
        if record is None:  # our kernel raised: run it, so that its error reaches the caller
            return False
        if record.remember:
            state.records[key] = record
            if signature is not None and len(state.memo) < 4 * MAX_SIGNATURES:
                state.memo[signature] = record.choice
        for log in _TUNE_LOG:
            log.append((_qualified_name(module), module, record))
    if record.choice:
        _FALLBACKS[state.op] += 1
    return record.choice


def _qualified_name(module: nn.Module) -> str:
    return getattr(module, "_fastops_tune_name", type(module).__name__)


def _lookup_or_measure(
    module: Tunable, state: TuningState, x: Tensor, key: Key, training: bool
) -> Record | None:
    entry = CACHE.get(key)
    if entry is not None:
        return Record(key, entry["choice"] == "torch", entry, "cache")
    entry = CACHE.shipped_entries().get(key)
    if entry is not None:
        return Record(key, entry["choice"] == "torch", entry, "shipped")
    torch_entry = {"choice": "torch", "fastops_us": None, "torch_us": None}
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return Record(key, True, torch_entry, "default: CUDA graph capture", remember=False)
    if not tuning_enabled():
        _notice(
            "disabled",
            f"fastops tuner: {TUNE_ENV}=0 and no cached kernel choice: modules run PyTorch's kernel "
            "for inputs not tuned before (run fastops.tune(model, example_inputs) to measure them)",
        )
        return Record(key, True, torch_entry, f"default: {TUNE_ENV}=0")
    if len(state.records) >= MAX_SIGNATURES:
        if not state.capped:
            state.capped = True
            _notice(
                f"cap:{id(module)}",
                f"fastops tuner: a {type(module).__name__} has tuned {MAX_SIGNATURES} kinds of input (dynamic "
                "shapes?); it runs PyTorch's kernel for new ones that are not in the cache",
            )
        return Record(key, True, torch_entry, "default: tuning cap reached")
    if torch.are_deterministic_algorithms_enabled() and not module.fastops_deterministic(x.device.type):
        return Record(key, True, torch_entry, "default: deterministic mode")
    measured = _measure(module, x, training)
    if measured is None:
        return None
    entry = measured
    CACHE.put(key, entry)
    return Record(key, entry["choice"] == "torch", entry, "measured")


# ---- timing -----------------------------------------------------------------------------------


def default_timer(device: torch.device) -> Timer:
    """Wall-clock seconds per call (CUDA: synchronized); on the CPU with one torch thread, the calling
    thread's CPU time, which time spent descheduled by other jobs on a shared machine does not
    inflate (with more threads the work runs on other threads too, so it has to be wall-clock)."""
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    clock = time.thread_time if device.type == "cpu" and torch.get_num_threads() == 1 else time.perf_counter

    def timer(path: str, fn: Callable[[], None], reps: int) -> float:
        synchronize()
        start = clock()
        for _ in range(reps):
            fn()
        synchronize()
        return (clock() - start) / reps

    return timer


_TIMER: list[Timer] = []  # a test's fake timer, if one is set


@contextlib.contextmanager
def use_timer(timer: Timer) -> Iterator[None]:
    """Time with ``timer`` instead of the clock (tests inject a deterministic one)."""
    _TIMER.append(timer)
    try:
        yield
    finally:
        _TIMER.remove(timer)


@contextlib.contextmanager
def _state_kept(module: nn.Module, device: torch.device) -> Iterator[None]:
    """Run timing calls as if they never happened: buffers (running statistics, counters) and the
    RNG state are put back afterwards."""
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, saved in buffers:
                buffer.copy_(saved)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)


def _agree(ours: Any, theirs: Any, low_precision: bool = False) -> bool:
    """Whether our output (and gradients) match PyTorch's closely enough to call them the same
    computation. This catches a broken kernel, not rounding: the error is measured over the whole
    tensor (its norm against the norm of PyTorch's result), since in fp16/bf16 PyTorch's own
    weight gradients, summed in the low precision, can be a few percent off elementwise while ours
    sum in fp32. NaN and inf must sit in the same places. The tests check the real tolerances."""
    if isinstance(ours, Tensor) and isinstance(theirs, Tensor):
        if ours.shape != theirs.shape:
            return False
        a, b = ours.detach().double(), theirs.detach().double()
        finite = torch.isfinite(a)
        if not (
            torch.equal(finite, torch.isfinite(b))
            and torch.equal(a[~finite].nan_to_num(), b[~finite].nan_to_num())
        ):
            return False
        a, b = a[finite], b[finite]
        full = ours.dtype in (torch.float32, torch.float64) and not low_precision
        tolerance = 1e-3 if full else 1e-1
        return bool(torch.linalg.vector_norm(a - b) <= tolerance * torch.linalg.vector_norm(b) + 1e-30)
    if isinstance(ours, (tuple, list)) and isinstance(theirs, (tuple, list)) and len(ours) == len(theirs):
        return all(_agree(a, b, low_precision) for a, b in zip(ours, theirs, strict=True))
    return ours is None and theirs is None


def _closer_to_float64(ours: Any, theirs: Any, reference: Callable[[], Any], low_precision: bool) -> bool:
    """Whether ours, which disagrees with PyTorch's result, agrees with PyTorch's computation in
    float64 and is no farther from it than PyTorch's own result: then the difference is PyTorch's
    rounding, not a broken kernel. False when the float64 run itself fails (a device without it)."""
    try:
        exact = reference()
    except Exception:  # noqa: BLE001
        return False
    if not _agree(ours, exact, low_precision):
        return False
    return _distance(ours, exact) <= _distance(theirs, exact)


def _distance(a: Any, b: Any) -> float:
    """The summed norm of the differences of two results (tensors, or nested tuples of them)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return float(torch.linalg.vector_norm(a.detach().double() - b.detach().double()))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return sum(_distance(u, v) for u, v in zip(a, b, strict=True))
    return 0.0


def _measure(module: Tunable, x: Tensor, training: bool) -> dict[str, Any] | None:
    """Time both kernels on ``x``; the cache entry, or None when ours raised."""
    started = time.perf_counter()
    timer = _TIMER[-1] if _TIMER else default_timer(x.device)
    with _state_kept(module, x.device):
        xd = x.detach().requires_grad_(x.requires_grad) if training else x.detach()
        inputs = ([xd] if xd.requires_grad else []) + [p for p in module.parameters() if p.requires_grad]

        upstreams: dict[tuple[Any, ...], Tensor] = {}

        def upstream(o: Tensor) -> Tensor:
            """A fixed random upstream gradient per output shape, from a private generator (the
            caller's RNG stream is untouched). Not ones: the gradient of a normalisation for a
            constant upstream is zero, and two kernels' rounding noise never agrees. Not seed 0
            either: an input drawn after ``torch.manual_seed(0)`` would equal it, and a batch norm's
            input gradient for an upstream equal to its input is zero too. Laid out as the output
            is (a channels_last output gets a channels_last upstream, as the next layer would hand it
            back): a backward given another layout may take a slower path, or convert first, and then
            measure 6x slower than in training (seen: channels_last depthwise, NCHW upstream)."""
            key = (tuple(o.shape), o.stride(), o.dtype, o.device)
            if key not in upstreams:
                generator = torch.Generator(device=o.device).manual_seed(_UPSTREAM_SEED)
                values = torch.randn(o.shape, generator=generator, device=o.device)
                upstreams[key] = torch.empty_like(o).copy_(values)
            return upstreams[key]

        def step(
            forward: Callable[[Tensor], Any], x_in: Tensor = xd, wrt: list[Tensor] = inputs
        ) -> Callable[[], Any]:
            def run() -> Any:
                out = forward(x_in)
                if training and wrt:
                    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.requires_grad]
                    grads = torch.autograd.grad(outs, wrt, [upstream(o) for o in outs], allow_unused=True)
                    return out, grads
                return out, None

            return run

        def float64_reference() -> Any:
            """PyTorch's side in float64, on a copy of the module: the arbiter when the two kernels
            disagree. Where PyTorch rounds in the low precision and ours accumulates in fp32, ours
            can be the closer one (a bf16 hardsigmoid gate whose inputs all round onto its corner
            has a zero gradient in PyTorch's kernel, and ours a true one)."""
            reference = copy.deepcopy(module).double()
            x64 = xd.detach().double().requires_grad_(xd.requires_grad)
            wrt = ([x64] if x64.requires_grad else []) + [
                p for p in reference.parameters() if p.requires_grad
            ]
            return step(reference._torch_forward, x64, wrt)()

        ours, theirs = step(module._fastops_forward), step(module._torch_forward)
        try:
            our_out = ours()
        except Exception as error:  # noqa: BLE001
            try:
                theirs()
            except Exception:  # noqa: BLE001  (both refuse it: the real call raises ours, with our words)
                return None
            # PyTorch takes what our kernel cannot (float64 on CUDA, say): the module does as the one
            # it replaced, on PyTorch's kernel, a fallback named as one.
            why = f"fastops' kernel raised {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            return _finish({"choice": "torch", "fastops_us": None, "torch_us": None, "why": why}, started)
        try:
            their_out = theirs()
        except Exception as error:  # noqa: BLE001  (PyTorch cannot run it here: deterministic mode, a dtype)
            entry: dict[str, Any] = {
                "choice": "fastops",
                "fastops_us": None,
                "torch_us": None,
                "why": f"PyTorch's kernel raised {type(error).__name__}",
            }
            return _finish(entry, started)
        # Under autocast PyTorch's side computes in fp16/bf16 inside an fp32 result (its FCs, its
        # convs), so fp32 outputs carry half-precision error: judge them by the half tolerance.
        device_type = x.device.type
        autocast = device_type in ("cpu", "cuda") and torch.is_autocast_enabled(device_type)
        if not _agree(our_out, their_out, low_precision=autocast) and not _closer_to_float64(
            our_out, their_out, float64_reference, autocast
        ):
            _notice(
                f"disagree:{module.fastops_op()}",
                f"fastops tuner: fastops.{module.fastops_op()} disagreed with PyTorch's kernel on {tuple(x.shape)} "
                f"{x.dtype} ({x.device}); the module runs PyTorch's. Please report this with python -m fastops.info",
            )
            entry = {"choice": "torch", "fastops_us": None, "torch_us": None, "why": "outputs disagreed"}
            return _finish(entry, started)
        del our_out, their_out
        ours()
        theirs()  # a second warm-up each: allocator, cuDNN plans
        single = max(min(timer("fastops", ours, 1), timer("torch", theirs, 1)), 1e-7)
        reps = max(1, min(1000, int(2e-3 / single)))  # samples of ~2 ms
        per_round = 2 * reps * single
        rounds = max(3, min(9, int(0.2 / per_round))) | 1
        samples: dict[str, list[float]] = {"fastops": [], "torch": []}

        def time_rounds(count: int) -> None:
            for _ in range(count):  # interleaved, alternating which goes first
                first = len(samples["fastops"]) % 2 == 0
                order = (
                    (("fastops", ours), ("torch", theirs))
                    if first
                    else (("torch", theirs), ("fastops", ours))
                )
                for path, fn in order:
                    samples[path].append(timer(path, fn, reps))

        time_rounds(rounds)
        if abs(_paired_speedup(samples) - (1 + MARGIN)) < 0.05:
            time_rounds(2 * rounds)  # a close call: three times the rounds before deciding
    ours_s, torch_s = statistics.median(samples["fastops"]), statistics.median(samples["torch"])
    # Ours only when the rounds' paired ratios clear the margin and the medians of each side agree
    # that ours is faster: on a noisy machine the two can disagree (seen: paired 1.02x while the
    # medians said 0.79x), and then the measurement cannot tell, so the module keeps PyTorch's kernel.
    faster = _paired_speedup(samples) >= 1 + MARGIN and torch_s >= ours_s
    entry = {
        "choice": "fastops" if faster else "torch",
        "fastops_us": round(ours_s * 1e6, 3),
        "torch_us": round(torch_s * 1e6, 3),
    }
    return _finish(entry, started)


def _paired_speedup(samples: dict[str, list[float]]) -> float:
    """The median over rounds of PyTorch's time / ours within the round: a change of load or clock
    during timing moves both of a round's samples, so the ratios cancel it where medians of each
    side would not."""
    return statistics.median(t / o for o, t in zip(samples["fastops"], samples["torch"], strict=True))


def _finish(entry: dict[str, Any], started: float) -> dict[str, Any]:
    entry["when"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    _STATS.measured += 1
    _STATS.seconds += time.perf_counter() - started
    return entry


# ---- torch.compile --------------------------------------------------------------------------------


@torch.compiler.assume_constant_result
def compiled_choice(
    module_id: int,
    op: str,
    details: str,
    device_type: str,
    dtype: torch.dtype,
    training: bool,
    channels_last: bool,
) -> bool:
    """The choice a torch.compile trace bakes in (True: PyTorch's kernel). Run once per trace, in
    plain Python (the graph keeps only its result). A trace may see symbolic shapes, so the choice
    is per op, parameters, device, dtype, layout and training mode: ours where every choice this
    module (else the cache, else a shipped table) made for such inputs was ours, else PyTorch's."""
    dtype_name = str(dtype).removeprefix("torch.")

    def matching(keys: list[tuple[Key, bool]]) -> list[bool]:
        return [
            choice
            for key, choice in keys
            if key[0] == op
            and key[1] == details
            and key[2].split(":", 1)[0] == device_type
            and key[4] == dtype_name
            and key[7] == training
            and _layout_is_channels_last(key) == channels_last
        ]

    module = _MODULES.get(module_id)
    state = module.__dict__.get(STATE_ATTR) if module is not None else None
    choices = matching([(k, r.choice) for k, r in state.records.items()]) if state is not None else []
    if not choices:
        choices = matching([(k, e["choice"] == "torch") for k, e in CACHE.all_entries().items()])
    if not choices:
        choices = matching([(k, e["choice"] == "torch") for k, e in CACHE.shipped_entries().items()])
    if not choices:
        _notice(
            "compile",
            "fastops tuner: torch.compile traced a fastops module with no tuned kernel choice for its input; "
            "it runs PyTorch's kernel there. Run fastops.tune(model, example_inputs) (or one eager step) "
            "before compiling to use the measured choice",
        )
        return True
    return any(choices)


def _layout_is_channels_last(key: Key) -> bool:
    shape, strides = key[5], key[6]
    return len(shape) == 4 and tuple(strides) == _channels_last_strides(shape) != _contiguous_strides(shape)


# ---- tune(): ahead of a run -------------------------------------------------------------------


@dataclass(frozen=True)
class TuneRow:
    module: str
    kind: str  # the kind of input, in words
    fastops_us: float | None
    torch_us: float | None
    choice: str  # "fastops" or "torch"
    source: str


@dataclass
class TuneTable:
    """What :func:`tune` decided, one row per module and kind of input."""

    rows: list[TuneRow]
    seconds: float  # time spent timing in this call
    measured: int  # kinds of input timed (the others came from the cache)

    def __str__(self) -> str:
        lines = [
            f"fastops.tune: {len(self.rows)} choice(s), {self.measured} measured in {self.seconds:.2f} s, "
            f"the rest from the cache"
        ]
        for row in self.rows:
            times = (
                f"fastops {row.fastops_us:.1f} us, PyTorch {row.torch_us:.1f} us"
                if row.fastops_us is not None and row.torch_us is not None
                else "not timed"
            )
            lines.append(f"  {row.module}: {row.kind}: {row.choice} ({times}; {row.source})")
        return "\n".join(lines)


def _tuned_modules(model: nn.Module) -> list[tuple[str, Tunable]]:
    return [(name or "<model>", m) for name, m in model.named_modules() if isinstance(m, Tunable)]


def tune(
    model: nn.Module,
    example_inputs: Any,
    training: bool = True,
    *,
    broadcast: bool = True,
) -> TuneTable:
    """Measure the kernel choice of every fastops module of ``model`` for ``example_inputs`` ahead of
    a run, and return the table of choices (signature, our time, PyTorch's, the choice).

    Args:
        model: a model after :func:`fastops.swap_modules` (or one built from fastops modules).
        example_inputs: what ``model`` is called with: a Tensor, a tuple of positional arguments, or
            a dict of keyword arguments; the shapes the run will use.
        training: tune for training (forward + backward timed, train mode) or inference (forward
            only, eval mode, no grad).
        broadcast: under ``torch.distributed`` (initialised), every rank adopts rank 0's choices, so
            the ranks run the same kernels. Every rank must call ``tune`` then.

    One forward runs, and the model is left as it was: train/eval mode, buffers (BatchNorm running
    statistics), RNG state; no ``.grad`` is touched. Timing runs even with ``FASTOPS_TUNE=0``; choices
    already in the cache are reused, not timed again. Call it before ``torch.compile`` so that the
    compiled graph uses the measured choices, and inside the ``torch.autocast`` context the run uses
    (the autocast dtype is part of a kind of input)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fastops.tune: expected model to be an nn.Module, got {type(model).__name__}")
    modules = _tuned_modules(model)
    for name, m in modules:
        m.__dict__.pop(STATE_ATTR, None)  # look every kind of input up again, to report it
        m.__dict__["_fastops_tune_name"] = name
    modes = {m: m.training for m in model.modules()}
    device = next((t.device for t in model.parameters()), torch.device("cpu"))
    before = stats()
    log: list[tuple[str, nn.Module, Record]] = []
    _TUNE_LOG.append(log)
    _FORCE_TUNING.on = True
    try:
        with _state_kept(model, device), torch.set_grad_enabled(training):
            model.train(training)
            if isinstance(example_inputs, dict):
                model(**example_inputs)
            elif isinstance(example_inputs, tuple):
                model(*example_inputs)
            else:
                model(example_inputs)
    finally:
        _FORCE_TUNING.on = False
        _TUNE_LOG.remove(log)
        for sub, mode in modes.items():
            if sub.training != mode:
                sub.__dict__.pop(STATE_ATTR, None)  # a mode-dependent choice (BatchNorm) is stale
                sub.training = mode
    if broadcast and torch.distributed.is_available() and torch.distributed.is_initialized():
        _adopt_rank0(log)
    after = stats()
    rows = [
        TuneRow(
            name,
            describe_key(record.key),
            record.entry.get("fastops_us"),
            record.entry.get("torch_us"),
            "torch" if record.choice else "fastops",
            record.source,
        )
        for name, _, record in log
    ]
    return TuneTable(rows, after.seconds - before.seconds, after.measured - before.measured)


def _adopt_rank0(log: list[tuple[str, nn.Module, Record]]) -> None:
    """Every rank takes rank 0's choice for the i-th decision of this tune() call (the same model
    and inputs make the same decisions in the same order). Only this process's memos change, not
    any rank's cache: a cache holds what was measured on its machine."""
    import torch.distributed as dist

    payload: list[Any] = [[(name, record.choice) for name, _, record in log]]
    dist.broadcast_object_list(payload, src=0)
    theirs = payload[0]
    if len(theirs) != len(log):
        raise RuntimeError(
            f"fastops.tune: rank {dist.get_rank()} made {len(log)} kernel choices, rank 0 made {len(theirs)}: "
            "call tune with the same model and example inputs on every rank"
        )
    for (name, module, record), (their_name, choice) in zip(log, theirs, strict=True):
        if name != their_name:
            raise RuntimeError(
                f"fastops.tune: rank {dist.get_rank()} tuned {name} where rank 0 tuned {their_name}"
            )
        if choice != record.choice:
            record.choice = choice
            record.source = "rank 0"
        state = module.__dict__[STATE_ATTR]
        state.records[record.key] = record
        state.memo.clear()  # rebuilt from the records on the next calls, with rank 0's choices


# ---- in words ------------------------------------------------------------------------------------


def describe(ops: Sequence[str] | None = None, limit: int = 12) -> list[str]:
    """The cached choices of this machine and build, in words: per op a count, then the kinds of
    input where PyTorch's kernel was chosen (up to ``limit``)."""
    entries = CACHE.all_entries()
    by_op: dict[str, list[tuple[Key, dict[str, Any]]]] = {}
    for key, entry in entries.items():
        if ops is None or key[0] in ops:
            by_op.setdefault(key[0], []).append((key, entry))
    lines = []
    for op in sorted(by_op):
        items = by_op[op]
        torch_items = [(k, e) for k, e in items if e["choice"] == "torch"]
        lines.append(
            f"{op}: {len(items)} kind(s) of input tuned; fastops' kernel on {len(items) - len(torch_items)}, "
            f"PyTorch's on {len(torch_items)}"
        )
        for key, entry in torch_items[:limit]:
            why = entry.get("why")
            times = (
                f"fastops {entry['fastops_us']:.1f} us, PyTorch {entry['torch_us']:.1f} us"
                if entry.get("fastops_us") and entry.get("torch_us")
                else why or "not timed"
            )
            lines.append(f"  PyTorch's for {describe_key(key)} ({times})")
        if len(torch_items) > limit:
            lines.append(f"  ... and {len(torch_items) - limit} more")
    return lines
