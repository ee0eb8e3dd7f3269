"""Finds the compiled kernels (fastops._C) or JIT-builds them from csrc/.

Order: with FASTOPS_JIT=1 always JIT; otherwise import the prebuilt fastops._C, and if there is
none but csrc/ is next to the package (a source checkout), JIT-build it. JIT builds are cached per
torch version, Python version, CUDA on/off and CPU ISA under $TORCH_EXTENSIONS_DIR (default
~/.cache/torch_extensions), so a second import loads in well under a second.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from fastops import _build

COMPILED_CONFIG = _build.PACKAGE_DIR / "_compiled.json"


@dataclass
class LoadedExtension:
    mode: str  # "prebuilt" or "jit"
    path: str
    cpu_capability: str
    with_cuda: bool
    details: dict[str, str] = field(default_factory=dict)
    module: ModuleType | None = field(default=None, repr=False)  # the library as a Python module


_loaded: LoadedExtension | None = None


def _check_cpu_supports(capability: str, where: str) -> None:
    missing = _build.CAPABILITY_CPU_FLAGS.get(capability, set()) - _build.cpu_flags()
    if _build.cpu_flags() and missing:
        raise RuntimeError(
            f"fastops: {where} was compiled for the {capability} CPU ISA, but this CPU lacks "
            f"{sorted(missing)}. Rebuild with FASTOPS_CPU_CAPABILITY=avx2 (or default)."
        )


def _jit_build() -> LoadedExtension:
    import torch
    import torch.utils.cpp_extension as cpp_extension

    if not _build.CSRC_DIR.is_dir():
        raise RuntimeError(
            f"fastops: FASTOPS_JIT=1 needs the source tree, but {_build.CSRC_DIR} does not exist "
            "(JIT works from a source checkout or an editable install)"
        )
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise RuntimeError(
            f"fastops: no C++ compiler ({compiler!r}) on PATH, needed to compile the kernels. "
            "Install one (Debian/Ubuntu: apt-get install g++; conda: conda install gxx) or set CXX."
        )
    if not cpp_extension.is_ninja_available():
        raise RuntimeError("fastops: JIT compilation needs ninja: pip install ninja")

    _build.prepare_cuda_env()
    with_cuda = _build.want_cuda(torch.version.cuda) and (
        os.environ.get("FASTOPS_CUDA") == "1" or torch.cuda.is_available()
    )
    capability = _build.cpu_capability()
    _check_cpu_supports(capability, "the JIT build")
    tag = "cuda" if with_cuda else "cpu"
    version = torch.__version__.replace("+", "_")
    name = f"fastops_jit_{tag}_{capability}"
    base = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    # One cache per source tree too: two checkouts must not overwrite each other's objects.
    tree = hashlib.sha1(str(_build.CSRC_DIR).encode()).hexdigest()[:8]
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    build_dir = base / f"fastops-torch{version}-{py}" / f"{name}-{tree}"
    build_dir.mkdir(parents=True, exist_ok=True)

    sources = _build.sources(with_cuda)
    library = build_dir / f"{name}.so"
    inputs = [Path(s) for s in sources] + list((_build.CSRC_DIR / "include").rglob("*"))
    if not library.exists() or max(p.stat().st_mtime for p in inputs) > library.stat().st_mtime:
        print(
            f"fastops: compiling kernels from {_build.CSRC_DIR} ({tag}, {capability}) into "
            f"{build_dir}; this takes a few minutes the first time",
            file=sys.stderr,
            flush=True,
        )
    os.environ.setdefault("MAX_JOBS", str(_build.default_max_jobs()))
    module = cpp_extension.load(
        name=name,
        sources=sources,
        extra_include_paths=_build.include_dirs(),
        extra_cflags=_build.cxx_flags(with_cuda, capability),
        extra_cuda_cflags=_build.nvcc_flags(),
        extra_ldflags=_build.ld_flags(),
        build_directory=str(build_dir),
        is_python_module=True,  # imports it, which also registers the ops
        verbose=os.environ.get("FASTOPS_VERBOSE_BUILD") == "1",
    )
    return LoadedExtension("jit", str(library), capability, with_cuda, module=module)


def _import_prebuilt() -> LoadedExtension | None:
    import torch  # noqa: F401  (loads libc10/libtorch, which fastops._C links against)

    if importlib.util.find_spec("fastops._C") is None:
        return None
    config: dict = {}
    if COMPILED_CONFIG.exists():
        config = json.loads(COMPILED_CONFIG.read_text())
        _check_cpu_supports(config.get("cpu_capability", "default"), "fastops._C")
    module = importlib.import_module("fastops._C")
    return LoadedExtension(
        "prebuilt",
        str(module.__file__),
        config.get("cpu_capability", "unknown"),
        bool(config.get("with_cuda", False)),
        module=module,
    )


def load() -> LoadedExtension:
    """Loads the kernels once; every later call returns the same description."""
    global _loaded
    if _loaded is not None:
        return _loaded
    if os.environ.get("FASTOPS_JIT", "0") == "1":
        _loaded = _jit_build()
    else:
        _loaded = _import_prebuilt()
        if _loaded is None:
            if not _build.CSRC_DIR.is_dir():
                raise ImportError(
                    "fastops: the compiled kernels (fastops._C) are missing and there is no csrc/ "
                    "to JIT-build them from. Reinstall with: pip install --no-build-isolation fastops"
                )
            _loaded = _jit_build()
    import torch

    info = dict(item.split("=", 1) for item in torch.ops.fastops._build_info().split(";") if "=" in item)
    _loaded.details = info
    _loaded.cpu_capability = info.get("cpu_capability", _loaded.cpu_capability).lower()
    _loaded.with_cuda = info.get("cuda") == "1"
    return _loaded
