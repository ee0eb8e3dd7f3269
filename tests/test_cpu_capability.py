"""The CPU kernels' ISA levels in one library: which levels are built, which runs, forcing one at run
time, and that no vector instruction of a level leaks into code the DEFAULT level runs.

The op tests themselves run once per level: `make test` (the best level), `make test-avx2` and
`make test-default` (the level forced)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastops import _build, _extension

REPO = Path(__file__).resolve().parent.parent
X86_64 = _build._is_x86_64()


def _in_subprocess(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _runnable_levels() -> list[str]:
    built = _extension.load().cpu_capabilities_built
    flags = _build.cpu_flags()
    return [c for c in built if _build.CAPABILITY_CPU_FLAGS[c] <= flags or c == "default"]


def test_library_reports_the_levels_it_holds_and_the_one_that_runs() -> None:
    ext = _extension.load()
    assert ext.cpu_capabilities_built[0] == "default"
    assert ext.cpu_capabilities_built == [
        c for c in _build.CPU_CAPABILITIES if c in ext.cpu_capabilities_built
    ]
    expected = _build.requested_cpu_capability() or _build.best_cpu_capability(ext.cpu_capabilities_built)
    assert ext.cpu_capability == expected


@pytest.mark.parametrize("level", ["default", "avx2", "avx512"])
def test_forcing_a_level_at_run_time(level: str) -> None:
    """FASTOPS_CPU_CAPABILITY picks the kernels of one library; the tuner keys its cache on that level."""
    if level not in _runnable_levels():
        pytest.skip(f"the {level} level is not built or this CPU cannot run it")
    code = (
        "import torch, fastops; from fastops import _extension, tuner; e = _extension.load(); "
        "x = torch.rand(1000) + 0.1; torch.testing.assert_close(fastops.clipped_log(x), torch.log(x)); "
        "print(e.cpu_capability, tuner.fingerprint()['isa'], e.path)"
    )
    proc = _in_subprocess(code, FASTOPS_CPU_CAPABILITY=level)
    assert proc.returncode == 0, proc.stderr[-3000:]
    running, tuner_isa, path = proc.stdout.split()
    assert (running, tuner_isa) == (level, level)
    assert path == _extension.load().path  # the same library, not another build


def test_info_says_which_level_runs_and_which_were_built() -> None:
    proc = _in_subprocess("import fastops.info as i; print(i.report())", FASTOPS_CPU_CAPABILITY="default")
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = ", ".join(_extension.load().cpu_capabilities_built)
    assert f"CPU kernels: default ISA level running (built: {built})" in proc.stdout


def test_a_forced_level_the_library_lacks_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTOPS_CPU_CAPABILITY", "avx512")
    with pytest.raises(RuntimeError, match="holds the CPU kernels for default, avx2 only"):
        _extension._check_requested_capability(["default", "avx2"], "fastops._C")


def test_a_forced_level_this_cpu_cannot_run_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_build, "cpu_flags", lambda: {"sse2", "avx", "avx2", "fma", "f16c"})
    monkeypatch.setattr(_build, "_is_x86_64", lambda: True)
    monkeypatch.setenv("FASTOPS_CPU_CAPABILITY", "avx512")
    with pytest.raises(RuntimeError, match=r"lacks \['avx512bw', .*best level this CPU supports \(avx2\)"):
        _extension._check_requested_capability(list(_build.CPU_CAPABILITIES), "fastops._C")


def test_bad_capability_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTOPS_CPU_CAPABILITY", "sse9")
    with pytest.raises(ValueError, match="FASTOPS_CPU_CAPABILITY='sse9'"):
        _build.requested_cpu_capability()
    monkeypatch.setenv("FASTOPS_CPU_CAPABILITIES", "default,avx3")
    with pytest.raises(ValueError, match="FASTOPS_CPU_CAPABILITIES='avx3'"):
        _build.capabilities_to_build()


def test_levels_to_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_build, "_is_x86_64", lambda: True)
    monkeypatch.delenv("FASTOPS_CPU_CAPABILITIES", raising=False)
    assert _build.capabilities_to_build() == ["default", "avx2", "avx512"]
    monkeypatch.setenv("FASTOPS_CPU_CAPABILITIES", " AVX512 ")
    assert _build.capabilities_to_build() == ["default", "avx512"]  # DEFAULT always: it runs anywhere
    monkeypatch.setattr(_build, "_is_x86_64", lambda: False)
    monkeypatch.delenv("FASTOPS_CPU_CAPABILITIES")
    assert _build.capabilities_to_build() == ["default"]
    monkeypatch.setenv("FASTOPS_CPU_CAPABILITIES", "avx2")
    with pytest.raises(ValueError, match="names x86 levels"):
        _build.capabilities_to_build()


def test_default_level_and_shared_code_compile_without_x86_flags() -> None:
    flags = _build.cxx_flags(False, list(_build.CPU_CAPABILITIES)) + _build.capability_cxx_flags("default")
    assert not [f for f in flags if f.startswith("-m")], flags


# A function of the library whose name does not place it in an AVX2 or AVX-512 level (our kernels'
# namespaces fastops::cpu::AVX2 / ::AVX512, at::vec's of the same names, and every template
# instantiated for them carry the level in their name) is code the DEFAULT level may run. The compiler
# emits no YMM or ZMM register for the x86-64 baseline the DEFAULT level and the code compiled once
# target, so one there is an instruction of another level that an inline function shared between
# levels carried in (the linker keeps one copy of each, the first it sees).
_FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")
# (A name the demangler leaves as is, e.g. an OpenMP outlined body `_ZN..._omp_fn.0`, carries the level
# as its mangled length-prefixed form, 4AVX2 or 6AVX512.)
_LEVEL_NAME = re.compile(r"\bAVX2\b|\bAVX512\b|4AVX2|6AVX512")


def _functions_using_wide_registers(library: str) -> dict[str, str]:
    objdump = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", library], capture_output=True, text=True, check=True
    )
    found: dict[str, str] = {}
    name = ""
    for line in objdump.stdout.splitlines():
        match = _FUNCTION.match(line)
        if match:
            name = match.group(1)
        elif name not in found and ("%ymm" in line or "%zmm" in line) and not _LEVEL_NAME.search(name):
            found[name] = line.strip()
    return found


@pytest.mark.skipif(not X86_64 or shutil.which("objdump") is None, reason="needs x86-64 and objdump")
def test_no_avx_instruction_outside_the_avx_levels() -> None:
    ext = _extension.load()
    if len(ext.cpu_capabilities_built) < 2:
        pytest.skip("the library holds the DEFAULT level only")
    leaks = _functions_using_wide_registers(ext.path)
    assert not leaks, "AVX code the DEFAULT level can reach:\n" + json.dumps(
        dict(list(leaks.items())[:10]), indent=1
    )
