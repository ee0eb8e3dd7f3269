"""Finds the compiled kernels (fastops._C) or JIT-builds them from csrc/.

Order: with FASTOPS_JIT=1 always JIT; otherwise import the prebuilt fastops._C, and if there is
none but csrc/ is next to the package (a source checkout), JIT-build it. A JIT build is setup.py's
build of fastops._C (`setup.py build_ext`, the same per-ISA-level compilation), made into a cache
directory per torch version, Python version, CUDA on/off and set of CPU ISA levels under
$TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions); it is rerun only when a source is newer
than the library, so a second import loads in well under a second.

The library holds the CPU kernels for several ISA levels and runs the best one the CPU supports, or
the one FASTOPS_CPU_CAPABILITY names; a forced level the library lacks, or the CPU cannot run, is an
error here, before the library is loaded.

A prebuilt fastops._C compiled against another torch is never loaded: the dynamic linker would
answer with a missing C++ symbol (or, worse, load it). Its recorded torch (_compiled.json) is
compared with the running one first; a source checkout then JIT-builds for the running torch, an
installed package raises an ImportError that names both versions and the rebuild command.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import urllib.parse
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType

from fastops import _build

COMPILED_CONFIG = _build.PACKAGE_DIR / "_compiled.json"


@dataclass
class LoadedExtension:
    mode: str  # "prebuilt" or "jit"
    path: str
    cpu_capability: str  # the ISA level of the CPU kernels that run
    with_cuda: bool
    details: dict[str, str] = field(default_factory=dict)
    module: ModuleType | None = field(default=None, repr=False)  # the library as a Python module
    # The torch the kernels were compiled against: the running one for a JIT build, the recorded one
    # for a prebuilt library (None where the build recorded none).
    built_for_torch: str | None = None
    # The ISA levels the library holds CPU kernels for, worst first.
    cpu_capabilities_built: list[str] = field(default_factory=list)


_loaded: LoadedExtension | None = None


def _check_requested_capability(built: list[str], where: str) -> None:
    """A level forced by FASTOPS_CPU_CAPABILITY must be in the library and runnable on this CPU: raise
    before loading (the library's own choice cannot raise, and would fall back to another level)."""
    requested = _build.requested_cpu_capability()
    if requested is None:
        return
    if requested not in built:
        raise RuntimeError(
            f"fastops: FASTOPS_CPU_CAPABILITY={requested}, but {where} holds the CPU kernels for "
            f"{', '.join(built)} only. Unset it, or rebuild with FASTOPS_CPU_CAPABILITIES including {requested}."
        )
    flags = _build.cpu_flags()
    missing = _build.CAPABILITY_CPU_FLAGS[requested] - flags
    if flags and missing:
        raise RuntimeError(
            f"fastops: FASTOPS_CPU_CAPABILITY={requested}, but this CPU lacks {sorted(missing)}. Unset it: "
            f"the best level this CPU supports ({_build.best_cpu_capability(built)}) runs by default."
        )


def _jit_arch_list() -> str | None:
    """The visible GPUs' archs, for a JIT build with CUDA when TORCH_CUDA_ARCH_LIST is unset."""
    import torch

    if os.environ.get("TORCH_CUDA_ARCH_LIST") or not torch.cuda.is_available():
        return None
    archs = {
        ".".join(map(str, torch.cuda.get_device_capability(i))) for i in range(torch.cuda.device_count())
    }
    return ";".join(sorted(archs))


def _import_library(name: str, library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, library)
    assert spec is not None and spec.loader is not None, library
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers the ops
    return module


def _jit_build() -> LoadedExtension:
    import torch
    import torch.utils.cpp_extension as cpp_extension

    if not _build.CSRC_DIR.is_dir():
        raise RuntimeError(
            f"fastops: FASTOPS_JIT=1 needs the source tree, but {_build.CSRC_DIR} does not exist "
            "(JIT works from a source checkout or an editable install)"
        )
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler.split()[0]) is None:
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
    capabilities = _build.capabilities_to_build()
    _check_requested_capability(capabilities, "the JIT build")
    tag = "cuda" if with_cuda else "cpu"
    version = torch.__version__.replace("+", "_")
    name = f"fastops_jit_{tag}_{'_'.join(capabilities)}"
    base = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    # One cache per source tree too: two checkouts must not overwrite each other's objects.
    tree = hashlib.sha1(str(_build.CSRC_DIR).encode()).hexdigest()[:8]
    py = f"py{sys.version_info.major}{sys.version_info.minor}"
    build_dir = base / f"fastops-torch{version}-{py}" / f"{name}-{tree}"
    build_dir.mkdir(parents=True, exist_ok=True)
    library = build_dir / "lib" / "fastops" / f"_C{sysconfig.get_config_var('EXT_SUFFIX')}"

    inputs = [p for p in _build.CSRC_DIR.rglob("*") if p.is_file()]
    inputs += [_build.SOURCE_ROOT / "setup.py", _build.PACKAGE_DIR / "_build.py"]
    if not library.exists() or max(p.stat().st_mtime for p in inputs) > library.stat().st_mtime:
        print(
            f"fastops: compiling kernels from {_build.CSRC_DIR} ({tag}, CPU ISA levels "
            f"{', '.join(capabilities)}) into {build_dir}; this takes a few minutes the first time",
            file=sys.stderr,
            flush=True,
        )
        env = {**os.environ, "FASTOPS_CUDA": "1" if with_cuda else "0"}
        arch_list = _jit_arch_list() if with_cuda else None
        if arch_list:
            env["TORCH_CUDA_ARCH_LIST"] = arch_list
        command = [sys.executable, "setup.py", "build_ext", "--build-lib", str(build_dir / "lib")]
        command += ["--build-temp", str(build_dir / "temp")]
        verbose = os.environ.get("FASTOPS_VERBOSE_BUILD") == "1"
        proc = subprocess.run(
            command, cwd=_build.SOURCE_ROOT, env=env, capture_output=not verbose, text=True, check=False
        )
        if proc.returncode != 0:
            output = "" if verbose else (proc.stdout + proc.stderr)[-6000:]
            raise RuntimeError(f"fastops: the JIT build failed ({' '.join(command)}):\n{output}")
        # setuptools leaves an up-to-date library untouched (an edit to a file it does not build, a
        # .cu in a CPU build): mark it current so the next import does not run the build again.
        os.utime(library)
    module = _import_library("fastops._C", library)
    return LoadedExtension(
        "jit",
        str(library),
        "unknown",
        with_cuda,
        built_for_torch=torch.__version__,
        module=module,
        cpu_capabilities_built=capabilities,
    )


def _torch_mismatch(recorded: dict) -> tuple[str, str] | None:
    """(the torch fastops._C was built against, the running torch) where they differ, else None.

    "The same torch" means the same full version string (local label included: +cpu and +cu130 builds
    of one release are separate binaries that nothing promises to be interchangeable, and a source
    build's +git<sha> is its only name), the same CUDA version and the same C++11 ABI flag; each is
    compared where the build recorded it. Too strict costs a rebuild; too loose, a crash.
    """
    running = _build.torch_identity()
    keys = [k for k in running if k in recorded and recorded[k] != running[k]]
    if not keys:
        return None

    def describe(identity: dict) -> str:
        # The version always; the CUDA version and the ABI only where they are what differs.
        text = str(identity.get("torch", "(version not recorded)"))
        extra = []
        if "torch_cuda" in keys:
            extra.append(f"CUDA {identity['torch_cuda']}" if identity["torch_cuda"] else "CPU-only")
        if "torch_cxx11_abi" in keys:
            extra.append(f"_GLIBCXX_USE_CXX11_ABI={int(bool(identity['torch_cxx11_abi']))}")
        return text + (f" ({', '.join(extra)})" if extra else "")

    return describe(recorded), describe(running)


def _rebuild_command() -> str:
    """The one command that rebuilds fastops for the running torch, from where it was installed from.

    pip records a local source directory in direct_url.json (PEP 610); a wheel or an index install
    leaves no source to rebuild from, so the command then names a placeholder."""
    source, editable = "<fastops source directory or sdist>", False
    try:
        dist = metadata.distribution("fastops")
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        info = {}
    url = str(info.get("url", ""))
    if url.startswith("file://") and "dir_info" in info:
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
        editable = bool(info["dir_info"].get("editable", False))
        # Only where that distribution is this package: another environment's fastops (an editable
        # install of another checkout) must not be named.
        installed = path / "fastops" if editable else Path(str(dist.locate_file("fastops")))
        if installed.resolve() == _build.PACKAGE_DIR:
            source = str(path)
        else:
            editable = False
    # --no-deps: the rebuilt wheel pins the running torch, and pip must not reinstall it.
    return f"pip install --no-build-isolation --force-reinstall --no-deps {'-e ' if editable else ''}{source}"


def _wrong_torch_error(library: str, built: str | None, running: str, linker: str = "") -> ImportError:
    if built is None:
        was = "were compiled against another torch"
    elif built == running:
        was = f"were compiled against another build of torch {built}"
    else:
        was = f"were compiled against torch {built}"
    return ImportError(
        f"fastops: the compiled kernels ({library}) {was}, but torch {running} is running; a C++ "
        "extension only loads into the torch build it was compiled against"
        + (f" (the dynamic linker: {linker})" if linker else "")
        + f". Rebuild fastops for this torch:\n    {_rebuild_command()}"
        + (f"\nor install the torch it was built for (torch {built})." if built and built != running else "")
    )


def _jit_instead(library: str, why: str) -> None:
    """The one-line notice of a source checkout that compiles csrc/ instead of loading fastops._C."""
    print(
        f"fastops: {Path(library).name} {why}: using a JIT build of csrc/ for this torch instead",
        file=sys.stderr,
        flush=True,
    )


def _load_library() -> ModuleType:
    # Its own function so that the tests can see whether the library was loaded, and fail it.
    return importlib.import_module("fastops._C")


def _import_prebuilt() -> LoadedExtension | None:
    import torch  # (loads libc10/libtorch, which fastops._C links against)

    spec = importlib.util.find_spec("fastops._C")
    if spec is None:
        return None
    library = str(spec.origin)
    # A source checkout (or an editable install) can compile for the running torch instead.
    checkout = _build.CSRC_DIR.is_dir()
    config: dict = {}
    if COMPILED_CONFIG.exists():
        config = json.loads(COMPILED_CONFIG.read_text())
        mismatch = _torch_mismatch(config)
        if mismatch is not None:
            built, running = mismatch
            if checkout:
                _jit_instead(library, f"was built against torch {built}, torch {running} is running")
                return None
            raise _wrong_torch_error(library, built, running)
        _check_requested_capability(_recorded_capabilities(config), "fastops._C")
    try:
        module = _load_library()
    except (ImportError, OSError) as e:
        # What is left of an ABI mismatch that the record did not show (none written, or a torch
        # rebuilt under the same version): the linker's missing C++ symbol, said plainly. dlopen
        # failed, so nothing of the library was loaded and a JIT build can still register the ops.
        message = str(e)
        if "undefined symbol" not in message:
            raise
        linker = message[message.index("undefined symbol") :].splitlines()[0][:120]
        if checkout:
            _jit_instead(library, f"does not load into torch {torch.__version__} ({linker})")
            return None
        raise _wrong_torch_error(library, config.get("torch"), torch.__version__, linker) from e
    return LoadedExtension(
        "prebuilt",
        str(module.__file__),
        "unknown",
        bool(config.get("with_cuda", False)),
        module=module,
        built_for_torch=config.get("torch"),
        cpu_capabilities_built=_recorded_capabilities(config),
    )


def _recorded_capabilities(config: dict) -> list[str]:
    # A library from before run-time ISA dispatch recorded the one level it was compiled for.
    return list(config.get("cpu_capabilities_built") or [config.get("cpu_capability", "default")])


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
    if "cpu_capabilities_built" in info:
        _loaded.cpu_capabilities_built = info["cpu_capabilities_built"].split(",")
    requested = _build.requested_cpu_capability()
    if requested is not None and _loaded.cpu_capability != requested:
        raise RuntimeError(
            f"fastops: FASTOPS_CPU_CAPABILITY={requested}, but the library runs its {_loaded.cpu_capability} "
            f"CPU kernels ({_loaded.path})"
        )
    _loaded.with_cuda = info.get("cuda") == "1"
    return _loaded
