"""benchmarks/render_readme.py: the pages and the README table are rendered from the data, choosing the
newest clean run per op and machine, never a dirty one."""

from __future__ import annotations

from pathlib import Path

from benchmarks import common, render_readme


def test_pages_and_readme_are_rendered_from_the_data() -> None:
    stale = [
        str(path)
        for path, text in render_readme.render().items()
        if (text is None) or not path.exists() or path.read_text() != text
    ]
    assert not stale, (
        f"not rendered from benchmarks/results/data: {stale}; run python -m benchmarks.render_readme"
    )


def test_every_headline_op_has_data() -> None:
    ops = {run.op for run in render_readme.load_runs()}
    for row in render_readme.HEADLINES:
        assert ops & set(row.ops), f"{row.what}: no run of {row.ops} in benchmarks/results/data"


def facts(machine: str, date: str, sha: str, dirty: bool, device: str = "cpu") -> dict[str, str]:
    f = {
        "device": device,
        "machine": machine,
        "isa": "avx2" if device == "cpu" else "sm_90",
        "threads": "1" if device == "cpu" else "",
        "cores": "2" if device == "cpu" else "",
        "torch": "2.13.0",
        "cuda": "None",
        "python": "3.11.7",
        "fastops": "0.1.0",
        "build": "jit",
        "git_sha": sha,
        "dirty": str(dirty).lower(),
        "date": date,
        "clock": "wall clock",
        "command": "python -m benchmarks.bench_gelu",
    }
    f["machine_tag"] = common.machine_tag(f)
    return f


def write_run(data: Path, f: dict[str, str], eager_ms: float, tag: str = "", op: str = "gelu") -> Path:
    results = [
        common.Result(op, "erf", "fwd", "float32", "1M", provider, ms, ms, ms, 8 << 20, 1.0, 10.0)
        for provider, ms in (("fastops", 1.0), ("eager", eager_ms))
    ]
    path = data / op / common.run_file_name(f, tag)
    common.write_rows(path, common.long_rows(results, f, 40.0, tag))
    return path


def test_newest_clean_run_wins_and_a_dirty_run_never_shows(tmp_path: Path) -> None:
    data, results = tmp_path / "data", tmp_path / "results"
    results.mkdir()
    readme, index = tmp_path / "README.md", results / "README.md"
    for path in (readme, index):
        path.write_text(f"head\n{render_readme.START}\n{render_readme.END}\ntail\n")
    (results / "old_op.md").write_text("a page of an op with no data left\n")
    old = write_run(data, facts("Zen", "2026-11-01T10:00:00Z", "aaaaaaa", False), eager_ms=2.0)
    new = write_run(data, facts("Zen", "2026-11-02T10:00:00Z", "bbbbbbb", False), eager_ms=3.0)
    dirty = write_run(data, facts("Zen", "2026-11-03T10:00:00Z", "ccccccc", True), eager_ms=7.0)
    gpu_dirty = write_run(data, facts("H200", "2026-11-03T10:00:00Z", "ccccccc", True, "cuda"), eager_ms=9.0)
    bf16 = write_run(data, facts("Zen", "2026-11-01T09:00:00Z", "ddddddd", False), eager_ms=5.0, tag="bf16")
    assert "ccccccc-dirty" in dirty.name and bf16.name.endswith("_bf16.csv")

    out = render_readme.render(data, results, readme, index)
    page = out[results / "gelu.md"]
    table = out[readme]
    assert page is not None and table is not None
    assert new.name in page and bf16.name in page  # the newest clean run, and the tagged variant's
    assert old.name not in page and dirty.name not in page and gpu_dirty.name not in page
    assert "| 3.0000 |" in page and "| 7.0000 |" not in page and "| 9.0000 |" not in page
    assert "[3.00x](benchmarks/results/gelu.md) vs eager" in table  # the untagged run fills the cell
    assert "H200" not in table  # a machine with dirty runs only gets no column
    assert table.startswith("head\n") and table.endswith("tail\n")  # only the block changes
    assert out[results / "old_op.md"] is None  # a page whose op left the data goes

    # The untagged run from a dirty tree leaves the cell to the clean variant, named as such.
    new.unlink()
    old.unlink()
    table = render_readme.render(data, results, readme, index)[readme]
    assert table is not None and "[5.00x](benchmarks/results/gelu.md) vs eager (bf16 run)" in table


def test_a_run_without_a_known_commit_counts_as_dirty(tmp_path: Path) -> None:
    write_run(tmp_path, facts("Zen", "2026-11-01T10:00:00Z", "unknown", False), eager_ms=2.0)
    assert render_readme.choose(render_readme.load_runs(tmp_path)) == []
