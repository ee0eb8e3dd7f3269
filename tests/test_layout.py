"""The package's layering: no two fastops modules import each other, directly or around a circle.

Every import counts, also one inside a function: a lazy import hides a circle from Python but not from
a reader, who then cannot tell which module is built on which."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fastops"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The fastops modules ``name`` imports; ``from pkg import sub`` counts as importing ``pkg.sub``
    only (a submodule always runs its package's ``__init__`` first: not an edge of its own)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def _import_graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: _imports(path, name, set(paths)) for name, path in paths.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_fastops_modules_import_each_other() -> None:
    circles = _circles(_import_graph())
    assert not circles, f"import circles in fastops: {circles}"


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_swap_rules_live_apart_from_swap_and_nn() -> None:
    graph = _import_graph()
    assert "fastops.nn" not in graph["fastops.swap"]
    assert all("fastops.swap" not in graph[m] for m in graph if m.startswith("fastops.nn"))


def test_one_version_number() -> None:
    import tomllib

    from fastops._version import __version__

    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == __version__


# Where an op's files are, by its name alone (CONTRIBUTING.md), and the named exceptions.
_MIRROR = (
    "csrc/{op}_op.cpp",
    "csrc/cpu/{op}.cpp",
    "csrc/cuda/{op}.cu",
    "fastops/ops/{op}.py",
    "fastops/reference/{op}.py",
    "fastops/nn/{op}.py",
    "tests/ops/test_{op}.py",
    "tests/nn/test_{op}.py",
    "benchmarks/bench_{op}.py",
    "docs/{op}.md",
)
_NOT_MIRRORED = {
    "csrc/cuda/depthwise_separable_conv2d.cu",  # CPU-only: on CUDA its module runs the unfused pair
    "fastops/nn/fused_adam.py",  # an optimizer, not a module: fastops/optim/fused_adam.py
    "tests/nn/test_fused_adam.py",  # tests/optim/test_fused_adam.py
}


def _ops() -> list[str]:
    return sorted(p.stem for p in (PACKAGE / "ops").glob("*.py") if not p.stem.startswith("_"))


def test_every_op_has_its_files_under_its_own_name() -> None:
    root = PACKAGE.parent
    assert len(_ops()) >= 7
    missing = [
        path
        for op in _ops()
        for path in (pattern.format(op=op) for pattern in _MIRROR)
        if path not in _NOT_MIRRORED and not (root / path).exists()
    ]
    assert not missing, f"files missing from the mirror: {missing}"
    assert (root / "fastops/optim/fused_adam.py").exists() and (
        root / "tests/optim/test_fused_adam.py"
    ).exists()


def test_csrc_holds_no_file_of_several_ops() -> None:
    """Each op's schemas, autograd and autocast sit in its csrc/<op>_op.cpp, not in a shared file."""
    ops = set(_ops())
    top = {p.name for p in (PACKAGE.parent / "csrc").glob("*.cpp")}
    # Beside them only machinery: the library and its Python module, the tuner's call key, the
    # typed errors of the checks, and the choice of the CPU kernels' ISA level.
    machinery = {"registration.cpp", "tuner.cpp", "errors.cpp", "cpu_capability.cpp"}
    assert top == {f"{op}_op.cpp" for op in ops} | machinery


def test_ops_register_their_autograd_and_autocast_in_csrc() -> None:
    """An op's autograd (its backward op's too: the double backward) and its autocast rule sit with
    its schemas in csrc/<op>_op.cpp; fastops/ops/<op>.py holds the public function and fake kernels."""
    registering = {"register_autograd", "register_autocast"}
    for op in _ops():
        tree = ast.parse((PACKAGE / "ops" / f"{op}.py").read_text())
        called = {
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
        }
        assert not called & registering, (
            f"fastops/ops/{op}.py calls {called & registering}: csrc/{op}_op.cpp registers it"
        )
