"""How fastops._C is compiled: one description shared by setup.py and the JIT loader.

This module imports nothing from fastops and only torch's cpp_extension lazily, so setup.py can
load it by path before the package exists.

Knobs (environment variables):
  FASTOPS_CUDA=0|1            force the CUDA kernels off/on (default: on when torch is a CUDA build
                              and nvcc is found; CUDA_HOME defaults to /usr/local/cuda).
  FASTOPS_CPU_CAPABILITIES    the x86 vector ISA levels to compile the CPU kernels for, comma-separated
                              (default,avx2,avx512 on x86-64, default elsewhere; default is always built).
                              Which of them runs is chosen when the library loads: the best the CPU
                              supports, or the one FASTOPS_CPU_CAPABILITY names (a run-time setting).
  TORCH_CUDA_ARCH_LIST        CUDA archs for setup.py builds (default "8.0;9.0"); JIT builds target
                              the visible GPU when it is unset.
  MAX_JOBS                    parallel compile jobs (default: bounded by cores and by RAM).
  FASTOPS_DEBUG_INFO=1        keep the C++ debug info (-g) that Python's CFLAGS ask for (default: -g0).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE_DIR.parent
CSRC_DIR = SOURCE_ROOT / "csrc"
DEFAULT_CUDA_ARCH_LIST = "8.0;9.0"
# cc1plus on ATen headers peaks near 1.5 GiB, nvcc higher: budget 2 GiB a job.
_GIB_PER_COMPILE_JOB = 2.0

# The CPU kernels' ISA levels, worst first (csrc/include/fastops/cpu_capability.h). DEFAULT takes no
# x86 flag, so it builds for any architecture.
CPU_CAPABILITIES = ("default", "avx2", "avx512")
_CAPABILITY_FLAGS = {
    "default": ["-DCPU_CAPABILITY=DEFAULT", "-DCPU_CAPABILITY_DEFAULT"],
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "avx512": [
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512dq",
        "-mfma",
        "-mf16c",
        "-DCPU_CAPABILITY=AVX512",
        "-DCPU_CAPABILITY_AVX512",
    ],
}
# The /proc/cpuinfo flags each capability needs at run time (csrc/cpu_capability.cpp asks CPUID the same).
CAPABILITY_CPU_FLAGS = {
    "default": set(),
    "avx2": {"avx2", "fma", "f16c"},
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"},
}


def cpu_flags() -> set[str]:
    """The ISA flags of this machine's CPU (empty where /proc/cpuinfo is absent)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _parse_capability(value: str, variable: str) -> str:
    capability = value.strip().lower()
    if capability not in CPU_CAPABILITIES:
        raise ValueError(f"fastops: {variable}={value!r}; expected one of {list(CPU_CAPABILITIES)}")
    return capability


def capabilities_to_build() -> list[str]:
    """The ISA levels to compile the CPU kernels for, worst first: FASTOPS_CPU_CAPABILITIES, else every
    level on x86-64 and DEFAULT elsewhere. DEFAULT is always among them: it runs where no other can."""
    requested = os.environ.get("FASTOPS_CPU_CAPABILITIES", "").strip()
    if requested:
        chosen = {_parse_capability(c, "FASTOPS_CPU_CAPABILITIES") for c in requested.split(",") if c.strip()}
        if chosen - {"default"} and not _is_x86_64():
            raise ValueError(
                f"fastops: FASTOPS_CPU_CAPABILITIES={requested!r} names x86 levels, but this is {platform.machine()}"
            )
        return [c for c in CPU_CAPABILITIES if c in chosen or c == "default"]
    return list(CPU_CAPABILITIES) if _is_x86_64() else ["default"]


def requested_cpu_capability() -> str | None:
    """The level FASTOPS_CPU_CAPABILITY forces at run time, or None (the best the CPU supports)."""
    value = os.environ.get("FASTOPS_CPU_CAPABILITY", "")
    return _parse_capability(value, "FASTOPS_CPU_CAPABILITY") if value.strip() else None


def best_cpu_capability(built: list[str]) -> str:
    """The best of `built` this CPU supports (csrc/cpu_capability.cpp makes the same choice)."""
    if not _is_x86_64():
        return "default"
    flags = cpu_flags()
    return [c for c in CPU_CAPABILITIES if c in built and CAPABILITY_CPU_FLAGS[c] <= flags][-1]


def find_cuda_home() -> str | None:
    """CUDA_HOME, else /usr/local/cuda when nvcc is there, else the nvcc on PATH."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and Path(home, "bin", "nvcc").exists():
        return home
    if Path("/usr/local/cuda/bin/nvcc").exists():
        return "/usr/local/cuda"
    nvcc = shutil.which("nvcc")
    return str(Path(nvcc).resolve().parent.parent) if nvcc else None


def want_cuda(torch_cuda_version: str | None) -> bool:
    """Whether to compile the CUDA kernels (FASTOPS_CUDA overrides the automatic choice)."""
    forced = os.environ.get("FASTOPS_CUDA")
    if forced is not None and forced.strip() != "":
        if forced.strip() not in ("0", "1"):
            raise ValueError(f"fastops: FASTOPS_CUDA={forced!r}; expected 0 or 1")
        if forced.strip() == "1" and torch_cuda_version is None:
            raise RuntimeError(
                "fastops: FASTOPS_CUDA=1 but the installed torch is a CPU-only build; "
                "install a CUDA build of torch to compile the CUDA kernels"
            )
        if forced.strip() == "1" and find_cuda_home() is None:
            raise RuntimeError(
                "fastops: FASTOPS_CUDA=1 but nvcc was not found; set CUDA_HOME to the CUDA "
                "toolkit (the directory holding bin/nvcc)"
            )
        return forced.strip() == "1"
    return torch_cuda_version is not None and find_cuda_home() is not None


def prepare_cuda_env() -> None:
    """Point torch.utils.cpp_extension at the CUDA toolkit before it is imported."""
    home = find_cuda_home()
    if home and not os.environ.get("CUDA_HOME"):
        os.environ["CUDA_HOME"] = home


def default_max_jobs() -> int:
    cores = os.cpu_count() or 1
    try:
        ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        ram_gib = 8.0
    return max(1, min(cores, int(ram_gib / _GIB_PER_COMPILE_JOB)))


def sources(with_cuda: bool, root: Path = CSRC_DIR) -> list[str]:
    """The translation units compiled once: the device-neutral files (the schemas, autograd, autocast,
    the registration of every kernel) and, with CUDA, the .cu files."""
    files = sorted(root.glob("*.cpp"))
    if with_cuda:
        files += sorted((root / "cuda").glob("*.cu"))
    return [str(f) for f in files]


def cpu_kernel_sources(root: Path = CSRC_DIR) -> list[str]:
    """The CPU kernels' translation units, compiled once per ISA level (capability_cxx_flags)."""
    return [str(f) for f in sorted((root / "cpu").glob("*.cpp"))]


def include_dirs(root: Path = CSRC_DIR) -> list[str]:
    return [str(root / "include")]


@functools.cache
def openmp_flags() -> list[str]:
    """-fopenmp where the C++ compiler takes it (GCC, LLVM clang with libomp), else nothing (Apple clang
    refuses it): without it at::parallel_for silently runs on one thread, which is slower but correct."""
    compiler = os.environ.get("CXX", "c++")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp, "omp.cpp")
        source.write_text("#include <omp.h>\nint main() { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
        try:
            probe = subprocess.run(
                [*compiler.split(), "-fopenmp", str(source), "-o", str(Path(tmp, "omp"))],
                capture_output=True,
                timeout=120,
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
    return ["-fopenmp"] if probe.returncode == 0 else []


def cxx_flags(with_cuda: bool, built_capabilities: list[str]) -> list[str]:
    """The flags of every C++ translation unit; a CPU kernel's add capability_cxx_flags(level). The
    code compiled once learns which levels exist from FASTOPS_CPU_BUILT_<LEVEL>."""
    # No -std: torch.utils.cpp_extension adds the standard the installed torch needs (C++20 from 2.14).
    flags = ["-O3", *openmp_flags(), "-fno-math-errno"]
    # Python's CFLAGS carry -g, which made each translation unit compile 1.5-1.6x as long and the
    # library 251 MB (the DEFAULT-level NHWC depthwise TU: 163 s and 73 MB of object; -g0: 100 s, 3.6 MB).
    flags.append("-g" if os.environ.get("FASTOPS_DEBUG_INFO", "0") == "1" else "-g0")
    flags += [f"-DFASTOPS_CPU_BUILT_{c.upper()}" for c in built_capabilities if c != "default"]
    if with_cuda:
        flags.append("-DFASTOPS_WITH_CUDA")
    return flags


def capability_cxx_flags(capability: str) -> list[str]:
    """What a CPU kernel's translation unit adds for one ISA level: the -m flags and CPU_CAPABILITY."""
    return list(_CAPABILITY_FLAGS[capability])


def nvcc_flags() -> list[str]:
    # No --use_fast_math: it swaps erf/log/exp for approximations we would have to re-verify.
    return ["-O3", "-lineinfo", "--expt-relaxed-constexpr", "-DFASTOPS_WITH_CUDA"]


def ld_flags() -> list[str]:
    return openmp_flags()


def torch_identity() -> dict[str, str | bool | None]:
    """What tells one torch binary from another, ABI-wise: recorded in _compiled.json at build time and
    compared with the running torch at import (fastops._extension)."""
    import torch

    return {
        # The full version, local label included: 2.14.1+cpu and 2.14.1+cu130 are different builds,
        # and a source build's label (+git<sha>) is the only thing that tells two of them apart.
        "torch": torch.__version__,
        # Same version string, different build: a torch compiled from source keeps the release's
        # version but may differ in CUDA or in the C++ ABI of std::string, which every symbol carries.
        "torch_cuda": torch.version.cuda,
        "torch_cxx11_abi": bool(torch.compiled_with_cxx11_abi()),
    }


def torch_requirement(torch_version: str) -> str:
    """The wheel's dependency on torch: the version it was built against, without the local label.

    `torch==2.13.0` matches 2.13.0, 2.13.0+cpu and 2.13.0+cu130 (PEP 440: a public `==` ignores local
    labels), so the wheel installs next to the torch a user already has from any index, and pip flags
    a later `pip install -U torch` as a conflict. Pinning `==2.13.0+cpu` would make the wheel
    uninstallable wherever torch comes from PyPI, which never carries local labels (its plain 2.14.1 is
    the CUDA 13.0 build). Which flavour (cpu, cuXXX) runs is checked at import instead, against the
    full version recorded in _compiled.json.
    """
    return f"torch=={torch_version.split('+', 1)[0]}"
