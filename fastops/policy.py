"""Never slower: which kernel a fastops module runs, its own or PyTorch's.

A fastops module is there to make a model faster, and which kernel is faster depends on the machine
(CPU model and vector ISA, GPU, thread count, library versions) and on the input (dtype, layout,
shape, training or inference). So a module does not trust tables from other machines: the first
time it sees a new kind of input, :mod:`fastops.tuner` times both kernels on this machine and keeps
the faster, remembered in memory and in an on-disk cache (``~/.cache/fastops``). When PyTorch's
kernel runs, that is a fallback, named as one, counted (:func:`fallback_counts`) and never reported
as ours.

Which kernel runs, most specific first:

- ``module.backend``: ``"auto"`` (the default: the measured choice), ``"fastops"`` (always ours) or
  ``"torch"`` (always PyTorch's);
- the ``FASTOPS_BACKEND`` environment variable, the same three values, for every module whose
  ``backend`` is ``"auto"`` (``FASTOPS_BACKEND=fastops`` is how the tests and benchmarks time our
  kernels alone);
- under ``"auto"``, the tuner's choice for this kind of input (see :mod:`fastops.tuner` for
  ``FASTOPS_TUNE=0``, ``torch.compile``, CUDA graphs and several processes).

The functional ops (``fastops.gelu``, ``fastops.depthwise_conv2d``, ...) always run our kernels: the
choice is the modules', since a module is what :func:`fastops.swap_modules` puts into a model.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import NoReturn

import torch
from torch import Tensor, nn

from fastops import tuner
from fastops.tuner import _FALLBACKS, STATE_ATTR, differentiated

BACKENDS = ("auto", "fastops", "torch")
BACKEND_ENV = "FASTOPS_BACKEND"
__all__ = ["STATE_ATTR", "TunedModule", "differentiated", "fallback_counts", "reset_fallback_counts"]


class TunedModule(tuner.Tunable):
    """A fastops module that can run its fastops kernel or PyTorch's for the same computation.

    A subclass implements ``_fastops_forward(x)`` and ``_torch_forward(x)`` (the same result, as far
    as the op's tolerance goes) and names its op; :meth:`forward` runs the one :func:`runs_torch`
    picks. ``fastops_details()`` are the op parameters that can change which kernel is faster
    (kernel size, stride, GELU form); they are fixed when the module is built."""

    def __prepare_scriptable__(self) -> NoReturn:
        """``torch.jit.script`` calls this on each submodule before compiling, so a scripted model that
        holds a fastops module fails with this message instead of TorchScript's errors from inside our
        sources (the forwards call Python-registered custom ops with Python checks)."""
        raise RuntimeError(
            f"fastops.nn.{type(self).__name__} cannot be compiled by torch.jit.script. Use torch.jit.trace "
            "or torch.export (both record fastops' ops), or torch.compile; or script the model before "
            "fastops.swap_modules, or after report.undo()."
        )

    def forward(self, x: Tensor) -> Tensor:
        if runs_torch(self, x):
            return self._torch_forward(x)
        return self._fastops_forward(x)


def fallback_counts() -> Counter[str]:
    """How many module calls ran PyTorch's kernel under ``backend="auto"`` because it was measured
    faster (or no choice could be measured), by op. Eager calls; calls inside a torch.compile'd graph
    are decided when it is traced and not counted."""
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
    the variable is unset (~2 us, more than the rest of the decision); on POSIX os.environ keeps its
    bytes mapping in step with every os.environ / monkeypatch change, and a dict lookup is ~50 ns."""
    data = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(data, dict):
        value = data.get(_ENV_KEY)
        return None if value is None else os.fsdecode(value)
    return os.environ.get(BACKEND_ENV)


def _cached_choice(module: nn.Module, x: object, counts: Counter[str]) -> bool | None:
    """The module's remembered choice for x, or None (csrc/tuner.cpp); bound on first use."""
    globals()["_cached_choice"] = tuner._compiled().cached_choice
    return tuner._compiled().cached_choice(module, x, counts)


# Bound once: the modules' forwards ask on every call (an attribute walk through torch.compiler costs
# more than the call).
is_compiling = torch.compiler.is_compiling


def compiled_runner(op: str) -> Callable[..., Tensor | None]:
    """csrc/tuner.cpp's ``run_<op>(module, x, *op_args)``: the op's output when ``module`` remembers
    fastops' kernel as the faster one for this kind of x, else None (then the module's forward takes
    its Python path). A module's forward calls it first, outside torch.compile traces: one C call for
    the choice and the op instead of the Python decision and torch.ops' boxed call."""
    return getattr(tuner._compiled(), f"run_{op}")  # type: ignore[no-any-return]


def runs_torch(module: TunedModule, x: Tensor) -> bool:
    """Whether ``module`` runs PyTorch's kernel for input ``x``: its ``backend``, else
    FASTOPS_BACKEND, else under ``"auto"`` the tuner's measured choice for this kind of input.

    The common case, a module called again on a kind of input it has seen (every training step), is
    one call into csrc/tuner.cpp: a hash of the call and a lookup in the module's own memo."""
    if not is_compiling():
        choice = _cached_choice(module, x, _FALLBACKS)
        if choice is not None:
            return choice
    return _decide(module, x)


def _decide(module: TunedModule, x: Tensor) -> bool:
    if torch._C._are_functorch_transforms_active() and not is_compiling():
        # torch.func (grad, vjp, vmap, ...) transforms PyTorch's composition; our ops' autograd is
        # C++ (a torch::autograd::Function), which functorch cannot transform. Not a fallback: no count.
        return True
    backend = module.backend
    if backend == "auto":
        env = _env_backend()
        if env is not None and env != "auto":
            if env not in BACKENDS:
                raise ValueError(
                    f"fastops.nn.{type(module).__name__}: {BACKEND_ENV}={env!r}; expected one of {list(BACKENDS)}"
                )
            return env == "torch"
    elif backend not in BACKENDS:
        check_backend(f"nn.{type(module).__name__}", backend)
    else:
        return backend == "torch"

    if not is_compiling():
        if not isinstance(x, Tensor):
            raise TypeError(
                f"fastops.nn.{type(module).__name__}: expected x to be a Tensor, got {type(x).__name__}"
            )
        return tuner.decide(module, x)
    # Decided once, when the graph is traced, from what eager calls or fastops.tune measured: the
    # graph holds the chosen kernel and no tuner code (see tuner.compiled_choice).
    return tuner.compiled_choice(
        id(module),
        module.fastops_op(),
        module.fastops_details(),
        x.device.type,
        x.dtype,
        differentiated(x, tuple(module.parameters())),
        x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(),
    )
