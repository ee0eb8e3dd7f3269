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
capabilities = build.capabilities_to_build()
# Relative paths: setuptools refuses absolute source paths in some versions.
sources = [os.path.relpath(s, ROOT) for s in build.sources(with_cuda, ROOT / "csrc")]
cpu_kernel_sources = [os.path.relpath(s, ROOT) for s in build.cpu_kernel_sources(ROOT / "csrc")]
extension_class = CUDAExtension if with_cuda else CppExtension
extra_compile_args = {"cxx": build.cxx_flags(with_cuda, capabilities)}
if with_cuda:
    extra_compile_args["nvcc"] = build.nvcc_flags()
# The headers too: setuptools skips the build when no listed file is newer than the library, so an
# edit to a header alone would otherwise leave the old library in place (ninja's own depfiles then
# recompile exactly the files that include it). The CPU kernels too: they are compiled apart (below).
headers = sorted(
    os.path.relpath(h, ROOT) for pattern in ("*.h", "*.cuh") for h in (ROOT / "csrc").rglob(pattern)
)
ext = extension_class(
    name="fastops._C",
    sources=sources,
    depends=headers + cpu_kernel_sources,
    include_dirs=build.include_dirs(ROOT / "csrc"),
    extra_compile_args=extra_compile_args,
    extra_link_args=build.ld_flags(),
)


class BuildExtensionWithConfig(BuildExtension):
    """Compiles the CPU kernels once per ISA level and links them into fastops._C, and writes
    fastops/_compiled.json next to the built library: what it was compiled for, read at import before
    the library is loaded (another torch, or a forced ISA level it lacks, must not crash the import).

    cpp_extension compiles every source of an extension with the same flags, so the per-level objects
    are compiled here, through the same (ninja) compiler BuildExtension set up, which adds torch's own
    flags; each level in its own directory. They are linked after the code compiled once, DEFAULT
    first: an inline function of a shared header (ATen, the standard library) that several levels
    emit then resolves to a copy compiled without ISA flags, which every CPU can run."""

    def build_extension(self, ext) -> None:
        objects: list[str] = []
        for level in capabilities:
            args = {key: [*flags] for key, flags in ext.extra_compile_args.items()}
            args["cxx"] += build.capability_cxx_flags(level)
            objects += self.compiler.compile(
                cpu_kernel_sources,
                output_dir=os.path.join(self.build_temp, f"cpu_{level}"),
                include_dirs=ext.include_dirs,
                depends=ext.depends,
                extra_postargs=args,
            )
        ext.extra_objects = objects
        super().build_extension(ext)

    def run(self) -> None:
        super().run()
        config = {
            "cpu_capabilities_built": capabilities,
            "with_cuda": with_cuda,
            "cuda_arch_list": os.environ["TORCH_CUDA_ARCH_LIST"] if with_cuda else None,
            **build.torch_identity(),
        }
        target = Path(self.get_ext_fullpath("fastops._C")).parent / "_compiled.json"
        target.write_text(json.dumps(config, indent=2) + "\n")


print(
    f"fastops: building with CUDA={'on' if with_cuda else 'off'}"
    + (f" (archs {os.environ['TORCH_CUDA_ARCH_LIST']})" if with_cuda else "")
    + f", CPU ISA levels {','.join(capabilities)}, MAX_JOBS={os.environ['MAX_JOBS']}",
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
