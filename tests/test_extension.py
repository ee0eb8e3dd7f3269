"""Loading, building and reporting: the JIT path, fastops.info, and the build's error messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from fastops import _build, _extension

REPO = Path(__file__).resolve().parent.parent


def _run(
    code: list[str], env: dict[str, str] | None = None, timeout: int = 900
) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, *code], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def test_info_cli_reports_build_and_ops() -> None:
    proc = _run(["-m", "fastops.info"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "build: " in out and "torch " + torch.__version__ in out
    loaded = _extension.load()
    built_for = loaded.built_for_torch or "unknown (not recorded)"
    assert f"compiled against torch {built_for}, running torch {torch.__version__}" in out
    assert ("CUDA kernels: compiled in" in out) == _extension.load().with_cuda
    assert "clipped_log " in out.replace("clipped_log_backward", "")
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("clipped_log "))
    assert "cpu" in line


def test_jit_build_from_source_tree() -> None:
    """FASTOPS_JIT=1 compiles csrc/ with ninja (or reuses the cache) and the ops then run."""
    loaded = _extension.load()
    cache = os.environ.get("TORCH_EXTENSIONS_DIR") if loaded.mode == "jit" else None
    cache = cache or str(REPO / "build" / "jit-test-cache")
    code = (
        "import torch, fastops; from fastops import _extension; e = _extension.load(); "
        "assert e.mode == 'jit', e; x = torch.rand(100) + 0.5; "
        "torch.testing.assert_close(fastops.clipped_log(x), torch.log(x)); print('jit ok', e.path)"
    )
    # One ISA level is enough to prove the JIT path (and costs a third of the build of all three).
    env = {"FASTOPS_JIT": "1", "TORCH_EXTENSIONS_DIR": cache, "FASTOPS_CPU_CAPABILITIES": "default"}
    proc = _run(["-c", code], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "jit ok" in proc.stdout
    assert cache in proc.stdout  # the cache directory is the one TORCH_EXTENSIONS_DIR names


def test_jit_without_compiler_says_what_to_install(tmp_path: Path) -> None:
    proc = _run(
        ["-c", "import fastops"],
        env={"FASTOPS_JIT": "1", "CXX": "/nonexistent/c++", "TORCH_EXTENSIONS_DIR": str(tmp_path)},
        timeout=300,
    )
    assert proc.returncode != 0
    assert "no C++ compiler" in proc.stderr and "apt-get install g++" in proc.stderr


def test_setup_without_torch_fails_fast_with_advice() -> None:
    """What a plain (isolated) `pip install .` runs into: no torch in the build environment."""
    code = (
        "import runpy, sys; sys.modules['torch'] = None; sys.argv = ['setup.py', '--version']; "
        "runpy.run_path('setup.py', run_name='__main__')"
    )
    proc = _run(["-c", code], timeout=120)
    assert proc.returncode != 0
    assert "--no-build-isolation" in proc.stderr


@pytest.mark.parametrize("value", ["2", "yes"])
def test_bad_fastops_cuda_value(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("FASTOPS_CUDA", value)
    with pytest.raises(ValueError, match="FASTOPS_CUDA"):
        _build.want_cuda("13.0")


def test_forcing_cuda_on_cpu_torch_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTOPS_CUDA", "1")
    with pytest.raises(RuntimeError, match="torch is a CPU-only build"):
        _build.want_cuda(None)


def test_default_max_jobs_is_bounded() -> None:
    jobs = _build.default_max_jobs()
    assert 1 <= jobs <= (os.cpu_count() or 1)


# A library compiled against another torch: refused by name before it is loaded, or, in a source
# checkout, replaced by a JIT build. The real case (a 2.13.0 build under 2.14.1) is `make upgrade-check`.

LINKER_ERROR = (
    "/site/fastops/_C.cpython-311-x86_64-linux-gnu.so: undefined symbol: "
    "_ZN5torch8autograd13_wrap_outputsERKSt6vectorIN2at6TensorESaIS3_EE"
)


def _record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **changes: object) -> None:
    """Points the loader at a _compiled.json recording the running torch, with `changes` made to it."""
    config = {"cpu_capabilities_built": ["default"], "with_cuda": False, **_build.torch_identity(), **changes}
    path = tmp_path / "_compiled.json"
    path.write_text(json.dumps(config))
    monkeypatch.setattr(_extension, "COMPILED_CONFIG", path)


def _not_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As an installed wheel: no csrc/ to JIT-build from."""
    monkeypatch.setattr(_build, "CSRC_DIR", tmp_path / "no-csrc")


def _a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a source checkout: a csrc/ next to the package (the JIT build itself is stubbed)."""
    (tmp_path / "csrc").mkdir()
    monkeypatch.setattr(_build, "CSRC_DIR", tmp_path / "csrc")


def _library_loads(monkeypatch: pytest.MonkeyPatch, error: Exception | None = None) -> list[bool]:
    """Replaces the load of fastops._C (already loaded in this process) with a stub that records the
    call and raises `error` if given."""
    calls: list[bool] = []

    def load_library() -> types.ModuleType:
        calls.append(True)
        if error is not None:
            raise error
        module = types.ModuleType("fastops._C")
        module.__file__ = "/site/fastops/_C.so"
        return module

    monkeypatch.setattr(_extension, "_load_library", load_library)
    return calls


def _another_build() -> list[dict[str, object]]:
    """A record of each way a torch build can differ from the running one, the version string first."""
    public = torch.__version__.split("+", 1)[0]
    return [
        {"torch": "2.10.0+cpu" if not torch.__version__.startswith("2.10.0") else "2.11.0+cpu"},
        {"torch": public + "+cu999"},  # same release, another flavour: another binary
        {"torch_cuda": None if torch.version.cuda else "13.0"},
        {"torch_cxx11_abi": not torch.compiled_with_cxx11_abi()},
    ]


@pytest.mark.parametrize("changes", _another_build(), ids=["version", "local-label", "cuda", "cxx11-abi"])
def test_library_for_another_torch_is_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, changes: dict[str, object]
) -> None:
    _record(tmp_path, monkeypatch, **changes)
    _not_a_checkout(tmp_path, monkeypatch)
    calls = _library_loads(monkeypatch)
    with pytest.raises(ImportError) as info:
        _extension._import_prebuilt()
    message = str(info.value)
    assert not calls, "the library was loaded"
    mismatch = _extension._torch_mismatch(json.loads(_extension.COMPILED_CONFIG.read_text()))
    assert mismatch is not None
    built, running = mismatch
    assert f"compiled against torch {built}, but torch {running} is running" in message
    assert "pip install --no-build-isolation --force-reinstall --no-deps" in message
    if "torch" in changes:
        assert f"torch {changes['torch']}" in message and f"torch {torch.__version__}" in message
    if "torch_cuda" in changes:
        assert ("CPU-only" in built) == (changes["torch_cuda"] is None)


def test_library_for_the_running_torch_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _record(tmp_path, monkeypatch)
    _not_a_checkout(tmp_path, monkeypatch)
    calls = _library_loads(monkeypatch)
    loaded = _extension._import_prebuilt()
    assert calls and loaded is not None
    assert loaded.mode == "prebuilt" and loaded.built_for_torch == torch.__version__


def test_checkout_jit_builds_for_another_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a source checkout the import compiles csrc/ for the running torch, with a one-line notice."""
    _record(tmp_path, monkeypatch, torch="2.10.0+cpu")
    _a_checkout(tmp_path, monkeypatch)
    calls = _library_loads(monkeypatch)
    jit = _extension.LoadedExtension("jit", "/cache/fastops_jit.so", "default", False)
    monkeypatch.setattr(_extension, "_jit_build", lambda: jit)
    monkeypatch.setattr(_extension, "_loaded", None)
    assert _extension.load() is jit
    assert not calls, "the library was loaded"
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1, notice
    assert f"built against torch 2.10.0+cpu, torch {torch.__version__} is running" in notice[0]
    assert "JIT build of csrc/" in notice[0]


@pytest.mark.parametrize("error_type", [ImportError, OSError])
@pytest.mark.parametrize("recorded", [True, False], ids=["recorded-same", "not-recorded"])
def test_linker_error_says_which_torch_and_how_to_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error_type: type[Exception], recorded: bool
) -> None:
    """A missing C++ symbol that the record did not predict (no record, or a torch rebuilt under the
    same version) is re-raised as the same clear error."""
    if recorded:
        _record(tmp_path, monkeypatch)
    else:
        monkeypatch.setattr(_extension, "COMPILED_CONFIG", tmp_path / "absent.json")
    _not_a_checkout(tmp_path, monkeypatch)
    original = error_type(LINKER_ERROR)
    _library_loads(monkeypatch, original)
    with pytest.raises(ImportError) as info:
        _extension._import_prebuilt()
    message = str(info.value)
    assert info.value.__cause__ is original
    assert message.startswith("fastops: ")
    assert f"but torch {torch.__version__} is running" in message
    assert ("another build of torch" in message) == recorded
    assert "undefined symbol: _ZN5torch8autograd13_wrap_outputs" in message
    assert "pip install --no-build-isolation --force-reinstall --no-deps" in message


def test_linker_error_in_checkout_jit_builds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _record(tmp_path, monkeypatch)
    _a_checkout(tmp_path, monkeypatch)
    _library_loads(monkeypatch, ImportError(LINKER_ERROR))
    assert _extension._import_prebuilt() is None  # load() then JIT-builds
    notice = capsys.readouterr().err
    assert "does not load into torch" in notice and "undefined symbol" in notice and "JIT" in notice


def test_other_load_errors_are_not_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a missing symbol means another torch: a missing shared library keeps the loader's words."""
    _record(tmp_path, monkeypatch)
    _not_a_checkout(tmp_path, monkeypatch)
    original = ImportError("libcudart.so.13: cannot open shared object file: No such file or directory")
    _library_loads(monkeypatch, original)
    with pytest.raises(ImportError) as info:
        _extension._import_prebuilt()
    assert info.value is original


@pytest.mark.parametrize("editable", [True, False])
def test_rebuild_command_names_where_fastops_was_installed_from(
    monkeypatch: pytest.MonkeyPatch, editable: bool
) -> None:
    """From pip's direct_url.json (PEP 610), and only where that distribution is this package."""

    class Distribution:
        def __init__(self, source: Path, package: Path) -> None:
            self.source, self.package = source, package

        def read_text(self, name: str) -> str:
            assert name == "direct_url.json"
            return json.dumps({"url": self.source.as_uri(), "dir_info": {"editable": editable}})

        def locate_file(self, path: str) -> Path:
            assert path == "fastops"
            return self.package

    def installed(source: Path, package: Path) -> None:
        monkeypatch.setattr(_extension.metadata, "distribution", lambda name: Distribution(source, package))

    # An editable install's package is in its source directory; a regular one's in site-packages.
    source = _build.PACKAGE_DIR.parent if editable else Path("/home/me/fastops-src")
    installed(source, Path("/venv/site-packages/fastops") if editable else _build.PACKAGE_DIR)
    assert _extension._rebuild_command().endswith(("-e " if editable else "") + str(source))
    # Another environment's fastops (another checkout, another venv's site-packages) is never named.
    installed(Path("/work/other-checkout"), Path("/other-venv/site-packages/fastops"))
    assert _extension._rebuild_command().endswith("--no-deps <fastops source directory or sdist>")


@pytest.mark.parametrize(
    ("version", "requirement"),
    [
        ("2.13.0+cpu", "torch==2.13.0"),
        ("2.14.1", "torch==2.14.1"),
        ("2.15.0.dev20261101+cu130", "torch==2.15.0.dev20261101"),
    ],
)
def test_torch_requirement_drops_the_local_label(version: str, requirement: str) -> None:
    assert _build.torch_requirement(version) == requirement


def test_wheel_metadata_pins_the_building_torch(tmp_path: Path) -> None:
    """What `pip wheel --no-build-isolation .` writes into METADATA, without compiling anything."""
    code = (
        "import sys; from setuptools import build_meta; "
        f"print(build_meta.prepare_metadata_for_build_wheel({str(tmp_path)!r}))"
    )
    proc = _run(["-c", code], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metadata_file = tmp_path / proc.stdout.strip().splitlines()[-1] / "METADATA"
    requires = [ln for ln in metadata_file.read_text().splitlines() if ln.startswith("Requires-Dist: torch")]
    assert requires == [f"Requires-Dist: torch=={torch.__version__.split('+', 1)[0]}"]
