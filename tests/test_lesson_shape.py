"""Every lesson reads like its framework's own example: the code before its Checks within its budget, no cell
over 60 lines, no private name of another library there, and the technique's own constructs in view
(helpers.gallery.lesson_shape measures; `python -m helpers.gallery.lesson_shape` prints the table)."""

from __future__ import annotations

import nbformat
import pytest

from helpers.gallery.lesson_shape import BUDGETS, MAX_CELL_LINES, private_names, shape
from helpers.paths import NOTEBOOKS_DIR

LESSONS = sorted(p for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb") if p.stem[:2] in BUDGETS)


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_the_technique_is_in_view(path):
    s = shape(path)
    assert s.has_checks, "the notebook has no '## Checks' heading"
    assert s.largest_cell <= MAX_CELL_LINES, (
        f"cell {s.largest_cell_index} has {s.largest_cell} code lines: split it, or move measurement and "
        f"workarounds into helpers (at most {MAX_CELL_LINES})")
    assert s.before_checks <= BUDGETS[s.number], (
        f"{s.before_checks} code lines before Checks, over the budget of {BUDGETS[s.number]}")
    assert not s.private_names, f"private names of other libraries before Checks: {s.private_names}"
    assert not s.missing_anchors, f"the framework's own constructs are not in view: {s.missing_anchors}"


def test_every_lesson_has_a_budget():
    assert {p.stem[:2] for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")} - {"00"} == set(BUDGETS)


def test_the_measure_can_fail(tmp_path):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("processes = 2\n" * 80)
    params.metadata["tags"] = ["parameters"]
    private = "from accelerate import AcceleratorState\nAcceleratorState._reset_state()\n"
    nb.cells = [params, nbformat.v4.new_code_cell("x = 1\n\n" * 61 + private),
                nbformat.v4.new_markdown_cell("## Checks"), nbformat.v4.new_code_cell("y = 2\n" * 200)]
    path = tmp_path / "01_x.ipynb"
    nbformat.write(nb, str(path))
    s = shape(path)
    assert (s.before_checks, s.largest_cell, s.code_lines) == (63, 200, 263)   # the parameters cell aside
    assert s.private_names == ["AcceleratorState._reset_state"]
    assert s.missing_anchors == ["DistributedDataParallel"]
    with pytest.raises(AssertionError, match="cell 3 has 200 code lines"):
        test_the_technique_is_in_view(path)
    assert private_names("os._exit(1); self._x; torch.__version__; model._orig_mod") == ["model._orig_mod"]
