"""Never slower: where a fastops module runs PyTorch's kernel instead of ours.

A fastops module is there to make a model faster. Where this repository's benchmarks show PyTorch's
own kernel faster than ours for a kind of input (device, the CPU vector ISA, memory layout, dtype,
shape, and whether a backward follows), the module runs PyTorch's kernel for that input: a fallback,
named as one, counted (:func:`fallback_counts`), and never reported as ours. Each such region is a
:class:`SlowerRegion` with the measurement behind it (``evidence``); :func:`regions` lists them and
``python -m fastops.info`` prints the ones that apply on this machine.

Which kernel runs, most specific first:

- ``module.backend``: ``"auto"`` (the default: ours, except in a measured slower region),
  ``"fastops"`` (always ours) or ``"torch"`` (always PyTorch's);
- the ``FASTOPS_BACKEND`` environment variable, the same three values, for every module whose
  ``backend`` is ``"auto"`` (``FASTOPS_BACKEND=fastops`` is how the tests and benchmarks time our
  kernels alone).

The functional ops (``fastops.gelu``, ``fastops.depthwise_conv2d``, ...) always run our kernels: the
policy is the modules', since a module is what :func:`fastops.swap_modules` puts into a model.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

BACKENDS = ("auto", "fastops", "torch")
BACKEND_ENV = "FASTOPS_BACKEND"


@dataclass(frozen=True)
class Case:
    """One module call as the policy sees it."""

    op: str
    device: str  # x.device.type
    isa: str | None  # the vector ISA of fastops' CPU kernels ("avx512", "avx2"); None off the CPU
    channels_last: bool
    dtype: torch.dtype
    shape: tuple[int, ...]  # x's shape
    backward: bool  # autograd will run a backward through this call (training)
    params: dict[str, object] = field(default_factory=dict, compare=False)  # op-specific: kernel, stride


@dataclass(frozen=True)
class SlowerRegion:
    """A kind of input on which the benchmarks show PyTorch's kernel faster than ours.

    ``when`` decides on the shape and op parameters; the other fields narrow the region (an empty
    tuple or None: any). ``evidence`` names the results file and the numbers measured there."""

    op: str
    device: str
    what: str  # the region in words: "channels_last fp32, output maps up to 14x14, inference"
    evidence: str
    when: Callable[[Case], bool] = lambda case: True
    isas: tuple[str, ...] = ()
    channels_last: bool | None = None
    dtypes: tuple[torch.dtype, ...] = ()
    backward: bool | None = None  # True: training calls only; False: inference calls only

    def covers(self, case: Case) -> bool:
        return (
            case.op == self.op
            and case.device == self.device
            and (not self.isas or case.isa in self.isas)
            and (self.channels_last is None or case.channels_last == self.channels_last)
            and (not self.dtypes or case.dtype in self.dtypes)
            and (self.backward is None or case.backward == self.backward)
            and self.when(case)
        )


_REGIONS: list[SlowerRegion] = []
_FALLBACKS: Counter[str] = Counter()
# runs_torch's decisions by all a region can see of a call (and which region list, in which
# length), so that a module called again on the same kind of input, as every training step does,
# pays one dict lookup instead of building a Case and testing every region: that walk cost ~20 us
# per call, 5-8% of a small depthwise layer.
_DECISIONS: dict[tuple[object, ...], bool] = {}


def register_slower_region(region: SlowerRegion) -> None:
    """Add a region where modules of ``region.op`` run PyTorch's kernel under ``backend="auto"``."""
    if not isinstance(region, SlowerRegion):
        raise TypeError(
            f"fastops.policy.register_slower_region: expected a SlowerRegion, got {type(region).__name__}"
        )
    _REGIONS.append(region)


def regions(op: str | None = None) -> list[SlowerRegion]:
    """The registered slower regions (of ``op``, or all)."""
    return [r for r in _REGIONS if op is None or r.op == op]


def fallback_counts() -> Counter[str]:
    """How many module calls ran PyTorch's kernel because of a slower region, by op (eager calls;
    calls inside a torch.compile'd graph are decided when it is traced and not counted)."""
    return Counter(_FALLBACKS)


def reset_fallback_counts() -> None:
    _FALLBACKS.clear()


def check_backend(owner: str, backend: object) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"fastops.{owner}: expected backend to be one of {list(BACKENDS)}, got {backend!r}")
    return backend  # type: ignore[return-value]


_CPU_ISA: list[str] = []  # filled once; a plain list, which torch.compile reads as a constant


def cpu_isa() -> str:
    """The vector ISA fastops' CPU kernels run with in this process."""
    if not _CPU_ISA:
        from fastops import _extension

        _CPU_ISA.append(_extension.load().cpu_capability)
    return _CPU_ISA[0]


_ENV_KEY = os.fsencode(BACKEND_ENV)


def _env_backend() -> str | None:
    """FASTOPS_BACKEND, read on every module call. os.environ.get raises and catches a KeyError when
    the variable is unset (~2 us, more than the rest of the policy); on POSIX os.environ keeps its
    bytes mapping in step with every os.environ / monkeypatch change, and a dict lookup is ~50 ns."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(data, dict):
        value = data.get(_ENV_KEY)
        return None if value is None else os.fsdecode(value)
    return os.environ.get(BACKEND_ENV)


def _channels_last(x: Tensor) -> bool:
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def runs_torch(module: nn.Module, op: str, x: Tensor, **details: object) -> bool:
    """Whether ``module`` (a fastops module of op ``op``) runs PyTorch's kernel for input ``x``:
    its ``backend``, else FASTOPS_BACKEND, else under ``"auto"`` whether a slower region covers the
    call. A backward follows when x or one of the module's parameters needs a gradient; ``details``
    are what the op's regions decide on besides x (kernel size, stride, ...)."""
    backend = str(module.backend)
    if backend == "auto":
        backend = _env_backend() or "auto"
        if backend not in BACKENDS:
            raise ValueError(
                f"fastops.nn.{type(module).__name__}: {BACKEND_ENV}={backend!r}; expected one of {list(BACKENDS)}"
            )
    elif backend not in BACKENDS:
        check_backend(f"nn.{type(module).__name__}", backend)
    if backend != "auto":
        return backend == "torch"
    if not isinstance(x, Tensor):
        return False
    if not _REGIONS:
        return False
    # x.device builds a new object per access (a microsecond): only off the CPU.
    device = "cpu" if x.is_cpu else x.device.type
    backward = torch.is_grad_enabled() and (
        x.requires_grad or any(p.requires_grad for p in module.parameters())
    )
    compiling = torch.compiler.is_compiling()  # a traced graph is decided once, when traced: no cache
    cacheable = not compiling
    # The strides stand for the layout in the key (cheaper than testing it).
    key = (id(_REGIONS), len(_REGIONS), op, device, x.dtype, x.shape, x.stride(), backward, *details.items())
    try:
        torch_runs = _DECISIONS.get(key) if cacheable else None
    except TypeError:  # a detail that cannot be hashed: decide every call (and still count it)
        cacheable, torch_runs = False, None
    if torch_runs is None:
        isa = cpu_isa() if device == "cpu" else None
        case = Case(op, device, isa, _channels_last(x), x.dtype, tuple(x.shape), backward, details)
        torch_runs = any(r.covers(case) for r in _REGIONS if r.op == op and r.device == device)
        if cacheable:
            if len(_DECISIONS) >= 4096:
                _DECISIONS.clear()
            _DECISIONS[key] = torch_runs
    if torch_runs and not compiling:
        _FALLBACKS[op] += 1
    return torch_runs


def describe(isa: str | None = None, op: str | None = None) -> list[str]:
    """One line per slower region (of ``op``, or all) that applies to this machine's CPU ISA (or
    ``isa``), and every CUDA region."""
    isa = isa or cpu_isa()
    return [
        f"{r.op} on {r.device}, {r.what}: {r.evidence}"
        for r in regions(op)
        if r.device != "cpu" or not r.isas or isa in r.isas
    ]
