"""Builds fastops._C with torch.utils.cpp_extension (CUDA kernels when torch and nvcc allow).

Install with the torch you will run on already installed:
    pip install --no-build-isolation .        (or -e . for development)
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent

try:
    import torch
except ImportError:
    sys.exit(
        "fastops: torch is not importable in the build environment. fastops compiles against the "
        "torch you run with, so install torch first and build without isolation:\n"
        "    pip install torch\n"
        "    pip install --no-build-isolation .\n"
        "(a plain `pip install .` builds in an isolated environment that has no torch)"
    )


def _load_build_config():
    spec = importlib.util.spec_from_file_location("fastops_build", ROOT / "fastops" / "_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = _load_build_config()
build.prepare_cuda_env()
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", build.DEFAULT_CUDA_ARCH_LIST)
os.environ.setdefault("MAX_JOBS", str(build.default_max_jobs()))

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

with_cuda = build.want_cuda(torch.version.cuda)
capability = build.cpu_capability()
# Relative paths: setuptools refuses absolute source paths in some versions.
sources = [os.path.relpath(s, ROOT) for s in build.sources(with_cuda, ROOT / "csrc")]
extension_class = CUDAExtension if with_cuda else CppExtension
extra_compile_args = {"cxx": build.cxx_flags(with_cuda, capability)}
if with_cuda:
    extra_compile_args["nvcc"] = build.nvcc_flags()
# The headers too: setuptools skips the build when no listed file is newer than the library, so an
# edit to a header alone would otherwise leave the old library in place (ninja's own depfiles then
# recompile exactly the files that include it).
headers = sorted(
    os.path.relpath(h, ROOT) for pattern in ("*.h", "*.cuh") for h in (ROOT / "csrc").rglob(pattern)
)
ext = extension_class(
    name="fastops._C",
    sources=sources,
    depends=headers,
    include_dirs=build.include_dirs(ROOT / "csrc"),
    extra_compile_args=extra_compile_args,
    extra_link_args=build.ld_flags(),
)


class BuildExtensionWithConfig(BuildExtension):
    """Also writes fastops/_compiled.json next to the built library: what it was compiled for,
    read at import before the library is loaded (a CPU-ISA mismatch or another torch must not crash
    the import)."""

    def run(self) -> None:
        super().run()
        config = {
            "cpu_capability": capability,
            "with_cuda": with_cuda,
            "cuda_arch_list": os.environ["TORCH_CUDA_ARCH_LIST"] if with_cuda else None,
            **build.torch_identity(),
        }
        target = Path(self.get_ext_fullpath("fastops._C")).parent / "_compiled.json"
        target.write_text(json.dumps(config, indent=2) + "\n")


print(
    f"fastops: building with CUDA={'on' if with_cuda else 'off'}"
    + (f" (archs {os.environ['TORCH_CUDA_ARCH_LIST']})" if with_cuda else "")
    + f", CPU ISA {capability}, MAX_JOBS={os.environ['MAX_JOBS']}",
    file=sys.stderr,
)

setup(
    # Computed here, not in pyproject.toml: the library runs only with the torch it is compiled
    # against, so a wheel pins that torch (see _build.torch_requirement for the local label).
    install_requires=[build.torch_requirement(torch.__version__)],
    packages=find_packages(include=["fastops", "fastops.*"]),
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtensionWithConfig},
)
