"""The README and the docs tell the truth: its examples run, its commands exist, its links resolve."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_readme_stays_a_guide_people_read() -> None:
    lines = README.read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines; move detail into docs/ (budget: 200)"


@pytest.mark.parametrize("index", range(len(_blocks(README, "python"))))
def test_readme_python_example_runs(index: int, tmp_path: Path) -> None:
    # Each block on its own, in a fresh process and an empty directory (fit writes runs/ there).
    code = _blocks(README, "python")[index]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"README python block {index} failed:\n{code}\n{done.stderr[-3000:]}"


def test_readme_commands_exist() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for block in _blocks(README, "bash"):
        for module in re.findall(r"python -m ([\w.]+)", block) + re.findall(r" -m (fastops[\w.]*)", block):
            if module in ("pytest", "pip"):
                continue
            assert importlib.util.find_spec(module) is not None, f"README runs python -m {module}"
        for target in re.findall(r"^make ([\w-]+)", block, flags=re.M):
            assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), f"README runs make {target}"


def test_doc_links_resolve() -> None:
    for path in DOCS:
        for link in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if link.startswith(("http://", "https://", "#", "mailto:")):
                continue
            target = (path.parent / link.split("#", 1)[0]).resolve()
            assert target.exists(), f"{path.relative_to(ROOT)} links to {link}, which does not exist"
