"""benchmarks/render_readme.py: the README table names result files that exist and is up to date."""

from __future__ import annotations

from benchmarks import render_readme


def test_every_headline_file_exists_with_its_cases_and_a_baseline() -> None:
    for row in render_readme.HEADLINES:
        assert len(row.cells) == len(render_readme.COLUMNS), row.what
        for cell in row.cells:
            if cell is None:
                continue
            for suffix in (".csv", ".md"):
                assert (render_readme.RESULTS / f"{cell.stem}{suffix}").exists(), (
                    f"{row.what}: {cell.stem}{suffix}"
                )
            assert "](benchmarks/results/" in render_readme.table_cell(cell)


def test_readme_table_is_rendered_from_the_results() -> None:
    text = render_readme.README.read_text()
    body = text.split(render_readme.START, 1)[1].split(render_readme.END, 1)[0].strip()
    assert body == render_readme.table(), "README.md is stale: run python -m benchmarks.render_readme"


def test_index_lists_every_result_file() -> None:
    index = render_readme.INDEX.read_text()
    for path in render_readme.result_files():
        if not render_readme.headline(path):
            continue  # a file with no rows has no line
        assert f"**{path.stem}**" in index, f"{path.stem} missing: run python -m benchmarks.render_readme"
