"""Every FASTOPS_* environment variable, checked when fastops is imported: a bad value is a clear
error before any work (not a traceback at the first training step), a removed one says what
replaced it, and an unknown name (a typo) gets one warning."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping

_FLAG = ("0", "1")


def _one_of(*values: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value.strip().lower() in values else f"expected one of {list(values)}"

    return check


def _levels(value: str) -> str | None:
    names = [c.strip().lower() for c in value.split(",") if c.strip()]
    if names and all(c in ("default", "avx2", "avx512") for c in names):
        return None
    return "expected a comma-separated list of default, avx2, avx512"


def _directory(value: str) -> str | None:
    if not value.strip():
        return "expected a directory path, got an empty value"
    return "expected a directory, but it is a file" if os.path.isfile(value) else None


# name -> (what it does, check of its value: None when good, else what was expected)
KNOWN: dict[str, tuple[str, Callable[[str], str | None]]] = {
    "FASTOPS_BACKEND": (
        "which kernel modules run: auto (measured), fastops or torch",
        _one_of("auto", "fastops", "torch"),
    ),
    "FASTOPS_TUNE": ("0: never time kernels (use cached choices, else PyTorch's kernel)", _one_of(*_FLAG)),
    "FASTOPS_CACHE_DIR": ("where measured kernel choices are kept", _directory),
    "FASTOPS_JIT": ("1: compile csrc/ at import", _one_of(*_FLAG)),
    "FASTOPS_CUDA": ("build the CUDA kernels (0/1)", _one_of(*_FLAG)),
    "FASTOPS_CPU_CAPABILITY": (
        "the ISA level of the CPU kernels that runs (default: the best this CPU supports)",
        _one_of("default", "avx2", "avx512"),
    ),
    "FASTOPS_CPU_CAPABILITIES": (
        "the ISA levels to compile the CPU kernels for (build time), comma-separated",
        _levels,
    ),
    "FASTOPS_AVX512_BF16": ("0: round bf16 through at::vec instead of the instruction", _one_of(*_FLAG)),
    "FASTOPS_VERBOSE_BUILD": ("1: show the compiler's commands", _one_of(*_FLAG)),
    "FASTOPS_DEBUG_INFO": ("1: compile the C++ code with debug info (build time)", _one_of(*_FLAG)),
    # The test suite's and the benchmarks' own.
    "FASTOPS_TEST_LARGE": ("1: run the large-tensor tests", _one_of(*_FLAG)),
    "FASTOPS_TEST_SLOW": ("1: run the slow tests", _one_of(*_FLAG)),
    "FASTOPS_BENCHES": ("benchmarks to run", lambda value: None),
    "FASTOPS_GIT_SHA": (
        "the commit a benchmark run records where there is no .git (<sha>, or <sha>+dirty)",
        lambda value: None,
    ),
}

_SETTLED = (
    "removed: an A/B switch of the NCHW depthwise kernels, settled (the path runs where it was measured "
    "to pay); unset it"
)
REMOVED: dict[str, str] = {
    "FASTOPS_NCHW_REGISTER": _SETTLED,
    "FASTOPS_NCHW_WIDE": _SETTLED,
    "FASTOPS_NCHW_HALF_FP32": _SETTLED,
    "FASTOPS_CUDA_DEPTHWISE": (
        "removed: nn.DepthwiseConv2d follows FASTOPS_BACKEND / module.backend on CUDA too, and under "
        "'auto' its kernel is measured on this machine (unset it; FASTOPS_BACKEND=fastops runs ours everywhere)"
    ),
}


def check(environ: Mapping[str, str] = os.environ) -> None:
    """Raise ValueError for a bad or removed FASTOPS_* variable; warn once for an unknown one."""
    for name in sorted(k for k in environ if k.startswith("FASTOPS_")):
        value = environ[name]
        if name in REMOVED:
            raise ValueError(f"fastops: {name}={value!r} is {REMOVED[name]}")
        known = KNOWN.get(name)
        if known is None:
            warnings.warn(
                f"fastops: unknown environment variable {name} (known: {', '.join(sorted(KNOWN))})",
                stacklevel=3,
            )
            continue
        what, validate = known
        problem = validate(value)
        if problem is not None:
            raise ValueError(f"fastops: {name}={value!r} ({what}): {problem}")
