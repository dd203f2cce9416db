"""`make notebooks` (python -m helpers.gallery --store): a failed run leaves the stored notebook as it was and
keeps the executed copy, whose outputs say why."""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.gallery import execute

pytestmark = pytest.mark.notebook


def test_failed_store_keeps_the_notebook_and_the_executed_copy(tmp_path, monkeypatch):
    monkeypatch.setattr("helpers.paths.ROOT", tmp_path)
    path = tmp_path / "99_x.ipynb"
    nb = new_notebook(cells=[new_code_cell("print('reached')"), new_code_cell("assert 1 == 2, 'moved away'")])
    nbformat.write(nb, str(path))
    before = path.read_text()
    with pytest.raises(Exception, match="moved away"):
        execute.store_outputs(path, timeout=120)
    assert path.read_text() == before, "the stored notebook changed"
    kept = nbformat.read(str(tmp_path / "runs" / "store-failures" / "99_x.ipynb"), as_version=4)
    assert "reached" in kept.cells[0].outputs[0]["text"]
    assert kept.cells[1].outputs[0]["output_type"] == "error"

    nb.cells[1].source = "print('fixed')"
    nbformat.write(nb, str(path))
    execute.store_outputs(path, timeout=120)
    assert "fixed" in nbformat.read(str(path), as_version=4).cells[1].outputs[0]["text"]
