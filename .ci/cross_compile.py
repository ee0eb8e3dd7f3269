"""Compiles csrc/ for another architecture at the DEFAULT ISA level, objects only (nothing is linked).

What every CPU runs, the code compiled once and the DEFAULT level of the CPU kernels, must build without
x86 flags or intrinsics; this proves it for aarch64 (Graviton, Grace, Apple silicon under Linux) with
Debian's cross compiler (apt-get install g++-aarch64-linux-gnu), against the installed torch's headers
(they are the same on every architecture), with the flags setup.py uses.

    python .ci/cross_compile.py --target aarch64-linux-gnu
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load_build_config():
    spec = importlib.util.spec_from_file_location("fastops_build", ROOT / "fastops" / "_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--target", default="aarch64-linux-gnu", help="the cross compiler's prefix")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MAX_JOBS", os.cpu_count() or 1)))
    args = parser.parse_args()

    compiler = shutil.which(f"{args.target}-g++")
    if compiler is None:
        print(
            f"cross-compile: no {args.target}-g++ on PATH (apt-get install g++-{args.target})",
            file=sys.stderr,
        )
        return 1
    import torch
    from torch.utils.cpp_extension import include_paths

    build = _load_build_config()
    includes = [*build.include_dirs(), *include_paths(), sysconfig.get_paths()["include"]]
    flags = [
        "-std=c++20",
        "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        "-DTORCH_EXTENSION_NAME=_C",
        # The host's OpenMP probe says nothing of the cross compiler; GCC always takes -fopenmp.
        *[f for f in build.cxx_flags(False, ["default"]) if f != "-fopenmp"],
        "-fopenmp",
        *[f"-I{path}" for path in includes],
    ]
    once: list[tuple[Path, list[str]]] = [(Path(s), []) for s in build.sources(False)]
    per_level = [(Path(s), build.capability_cxx_flags("default")) for s in build.cpu_kernel_sources()]
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as out:

        def compile_one(job: tuple[Path, list[str]]) -> tuple[Path, subprocess.CompletedProcess]:
            source, extra = job
            obj = Path(out) / f"{source.parent.name}_{source.stem}.o"
            command = [compiler, *flags, *extra, "-c", str(source), "-o", str(obj)]
            return source, subprocess.run(command, capture_output=True, text=True)

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            results = list(pool.map(compile_one, once + per_level))
    failed = [(source, proc) for source, proc in results if proc.returncode != 0]
    for source, proc in failed:
        print(f"cross-compile: {source.relative_to(ROOT)} failed:\n{proc.stderr[-4000:]}", file=sys.stderr)
    print(
        f"cross-compile: {len(results) - len(failed)}/{len(results)} translation units compiled for "
        f"{args.target} (DEFAULT level) in {time.monotonic() - start:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
