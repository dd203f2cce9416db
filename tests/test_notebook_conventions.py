"""Rules every notebook in notebooks/ follows, checked on the stored files (cheap: nothing is executed)."""

import logging

import nbformat
import pytest

from helpers.execute import notebook_parameters
from helpers.paths import NOTEBOOKS_DIR

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_papermill_reads_every_parameter(path, caplog):
    """papermill skips a parameter line it cannot parse (an '=' in the comment, say) with only a log line."""
    from papermill.translators import PythonTranslator

    nb = nbformat.read(str(path), as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    with caplog.at_level(logging.WARNING):
        found = {p.name for p in PythonTranslator.inspect(cell)}
    assert not [r for r in caplog.records if "Unable to parse" in r.getMessage()], caplog.text
    assert found == set(notebook_parameters(path)), "papermill and the gallery read different parameters"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_step_cap_parameter(path):
    """Every notebook takes `max_steps` (None by default: the stored run is the full run)."""
    assert notebook_parameters(path).get("max_steps", "missing") is None
