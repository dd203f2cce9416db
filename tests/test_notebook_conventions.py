"""Rules every notebook in notebooks/ follows, checked on the stored files (cheap: nothing is executed)."""

import logging

import nbformat
import pytest

from helpers.gallery.execute import notebook_parameters
from helpers.paths import NOTEBOOKS_DIR
from tests.support import TRAINS_NOTHING

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


LAUNCHES = (".distributed(", "TorchTrainer(")


def _first_launch_cell(cells: list) -> int:
    return next(i for i, c in enumerate(cells)
                if c.cell_type == "code" and any(k in c.source for k in LAUNCHES))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_step_cap_is_checked_before_the_first_launch(path):
    """A bad `max_steps` (0, -1, 2.5) is refused by `check_max_steps` before anything is launched: notebook
    01's papermill test shows the message, and this, that every other notebook calls it early enough."""
    cells = nbformat.read(str(path), as_version=4).cells
    checked = [i for i, c in enumerate(cells)
               if c.cell_type == "code" and "check_max_steps(max_steps" in c.source]
    assert checked, "call helpers.step_cap.check_max_steps(max_steps) before the first launch"
    assert checked[0] < _first_launch_cell(cells), "check_max_steps(max_steps) comes after the first launch"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_shared_parameter_names(path):
    """Parameters of the same kind have the same name everywhere: every notebook that trains does so on GPUs
    when there are some, so each takes `precision` ("auto" by default), and one that trains nothing takes no
    `precision` it would ignore; the input data folder, where there is one, is `data_dir`, and outputs are
    never called that."""
    params = notebook_parameters(path)
    if path.stem in TRAINS_NOTHING:
        assert "precision" not in params, f"{path.stem} trains nothing: its precision would do nothing"
    else:
        assert params.get("precision", "missing") == "auto", "every training notebook takes precision='auto'"
    for name in params:
        if name.endswith("_csv") or name == "ratings_path":
            pytest.fail(f"{name}: a notebook reads its input from data_dir (a folder), not a file parameter")
    assert "mds_dir" not in params or "data_dir" in params


def test_the_rules_above_can_fail(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('processes = 2\nratings_csv = None\nmax_steps = None\n')
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    path = tmp_path / "99_x.ipynb"
    nbformat.write(nb, str(path))
    with pytest.raises(AssertionError, match="precision"):
        test_shared_parameter_names(path)
    cell.source += 'precision = "auto"\n'
    nbformat.write(nb, str(path))
    with pytest.raises(pytest.fail.Exception, match="ratings_csv"):
        test_shared_parameter_names(path)
    tour = tmp_path / "00_getting_started.ipynb"   # a notebook that trains nothing, with a precision
    nbformat.write(nb, str(tour))
    with pytest.raises(AssertionError, match="trains nothing"):
        test_shared_parameter_names(tour)
    # check_max_steps called, but after the launch
    nb.cells = [cell, nbformat.v4.new_code_cell("results = train.distributed(cfg)"),
                nbformat.v4.new_code_cell("check_max_steps(max_steps)")]
    nbformat.write(nb, str(path))
    with pytest.raises(AssertionError, match="after the first launch"):
        test_step_cap_is_checked_before_the_first_launch(path)
