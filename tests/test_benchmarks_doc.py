"""docs/benchmarks.md holds only what benchmarks/write_docs.py wrote, and its notebook times are current.

The page's figures are written by the runner, each benchmark section headed by the machine that measured
it; the notebook run times are read from the stored notebooks, so this fails the moment a notebook is
stored again without the table being rewritten (`python benchmarks/write_docs.py --notebook-times`).
"""

from __future__ import annotations

import json

import pytest

from benchmarks.write_docs import (
    NOTEBOOK_TIMES,
    PAGE,
    ROOT,
    SCRIPTS,
    markers,
    notebook_seconds,
    notebook_times_table,
    page_problems,
    replace_section,
)


def test_page_sections_are_written_and_current():
    problems = page_problems(PAGE.read_text())
    assert not problems, f"{PAGE.relative_to(ROOT)}: " + "; ".join(problems)


def test_every_runner_script_exists_and_takes_markdown():
    for name in SCRIPTS:
        source = (ROOT / "benchmarks" / f"{name}.py").read_text()
        assert '"--markdown"' in source, (
            f"benchmarks/{name}.py: add a --markdown option (benchmarks/write_docs.py runs it with one)")


def _page_with(section_body: str, name: str = "launch_latency") -> str:
    page = PAGE.read_text()
    return replace_section(page, *markers(name), section_body, f"### {name}.py")


def test_the_check_catches_a_stale_or_headless_page():
    """Each of these pages is wrong in one way the check names (the check failing on purpose)."""
    page = PAGE.read_text()
    times = page.split(NOTEBOOK_TIMES[0])[1].split(NOTEBOOK_TIMES[1])[0]
    first_row = next(line for line in times.splitlines() if line.startswith("| `"))
    cells = first_row.split(" | ")
    stale = page.replace(first_row, " | ".join([cells[0], str(int(cells[1]) + 1), *cells[2:]]))
    assert any("notebook run times differ" in p for p in page_problems(stale))

    headless = _page_with("| launcher | cold (s) |\n|---|---|\n| torchrun | 1.0 |")
    assert any("machine line" in p for p in page_problems(headless))

    tableless = _page_with("Machine: AMD EPYC, 2 CPUs usable of 2, AVX2, torch 2.14.1, Python 3.11.7.\n"
                           "Command: `python benchmarks/launch_latency.py`.")
    assert any("no table" in p for p in page_problems(tableless))

    start, end = markers("progress_overhead")
    unclosed = page.replace(end, "")
    assert any("unbalanced" in p for p in page_problems(unclosed))
    assert any("no section for progress_overhead" in p
               for p in page_problems(page.replace(start, "").replace(end, "")))
    assert any("no single" in p for p in page_problems(page.replace(NOTEBOOK_TIMES[1], "")))


def test_a_section_is_replaced_alone_and_a_new_one_appended():
    b = "<!-- bench:b -->\nold b\n<!-- /bench:b -->\n"
    page = replace_section(f"intro\n<!-- bench:a -->\nold a\n<!-- /bench:a -->\nmiddle\n{b}", *markers("a"),
                           "new a", "### a.py")
    assert page == f"intro\n<!-- bench:a -->\nnew a\n<!-- /bench:a -->\nmiddle\n{b}"
    page = replace_section(page, *markers("c"), "c's table", "### c.py")
    assert page.endswith(f"{b}\n### c.py\n\n<!-- bench:c -->\nc's table\n<!-- /bench:c -->\n")
    with pytest.raises(ValueError, match="repair the page"):
        replace_section(page + "<!-- bench:a -->", *markers("a"), "x", "### a.py")


def test_notebook_seconds_spans_first_cell_to_last_reply(tmp_path):
    def cell(start: str, end: str) -> dict:
        return {"cell_type": "code", "metadata": {"execution": {
            "iopub.status.busy": f"2000-01-01T00:{start}Z", "iopub.execute_input": f"2000-01-01T00:{start}Z",
            "shell.execute_reply": f"2000-01-01T00:{end}Z", "iopub.status.idle": f"2000-01-01T00:{end}Z"}}}

    path = tmp_path / "01_x.ipynb"
    path.write_text(json.dumps({"cells": [cell("00:01.000", "00:03.000"), {"cell_type": "markdown",
                                "metadata": {}}, cell("00:04.000", "01:05.500")], "metadata": {}}))
    assert notebook_seconds(path) == pytest.approx(64.5)
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "metadata": {}}], "metadata": {}}))
    assert notebook_seconds(path) is None
    assert "| `01_x` | not stored | not recorded |" in notebook_times_table(tmp_path)


def test_make_bench_runs_the_runner():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nbench:")[1].split("\n\n")[0]
    assert "benchmarks/write_docs.py" in recipe, "Makefile: `make bench` must run benchmarks/write_docs.py"
