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
    """A bad `max_steps` (0, -1, 2.5) is refused before anything is launched, by `check_settings` (which
    checks every parameter of the vocabulary) or `check_max_steps`: notebook 01's papermill test shows the
    message, and this, that every other notebook calls one of them early enough."""
    cells = nbformat.read(str(path), as_version=4).cells
    checked = [i for i, c in enumerate(cells) if c.cell_type == "code"
               and ("check_max_steps(max_steps" in c.source or "check_settings(" in c.source)]
    assert checked, "call helpers.settings.check_settings(parameters_as_run()) before the first launch"
    assert checked[0] < _first_launch_cell(cells), "the settings check comes after the first launch"


# One name per meaning across the gallery: each name, and the names no notebook may use for that meaning.
VOCABULARY = {
    # the user's data: a file or a folder, as the notebook documents
    "data_path": ("data_dir", "text_path", "dataset_path", "images_dir", "val_images_dir", "annotations_json",
                  "val_annotations_json", "ratings_path"),
    "output_dir": ("checkpoint_dir", "run_dir", "storage_path", "save_dir"),   # where a run writes
    "n_train": ("train_size", "train_images"),   # how many examples of the built-in data set
    "n_val": ("val_size", "val_images"),
    "n_test": ("test_size", "test_images"),
    "hidden_size": ("hidden", "d_model", "width"),   # the built model's width
    "layers": ("n_layers", "num_layers", "depth"),   # and depth
}
# The harness's parameters come after a comment line that ends the technique's.
HARNESS = ("cluster", "register_as", "max_steps", "run_parity", "parity_steps", "tracking_uri")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_shared_parameter_names(path):
    """Parameters of the same kind have the same name everywhere: every notebook that trains does so on GPUs
    when there are some, so each takes `precision` ("auto" by default), and one that trains nothing takes no
    `precision` it would ignore; the user's data is `data_path`, outputs go to `output_dir`, and so on
    (VOCABULARY)."""
    params = notebook_parameters(path)
    if path.stem in TRAINS_NOTHING:
        assert "precision" not in params, f"{path.stem} trains nothing: its precision would do nothing"
    else:
        assert params.get("precision", "missing") == "auto", "every training notebook takes precision='auto'"
    for name in params:
        for meaning, others in VOCABULARY.items():
            if name in others:
                pytest.fail(f"{name}: the gallery calls this {meaning!r} in every notebook")
        if name.endswith("_csv"):
            pytest.fail(f"{name}: a notebook reads its input from data_path, not a file parameter of its own")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_the_harness_parameters_come_last(path):
    """The technique's parameters first; then a comment line; then only the harness's (HARNESS)."""
    cell = next(c for c in nbformat.read(str(path), as_version=4).cells
                if "parameters" in c.metadata.get("tags", []))
    lines = [line.strip() for line in cell.source.splitlines() if line.strip()]
    split = next((i for i, line in enumerate(lines) if line.startswith("#")), len(lines))
    after = [line.split("=")[0].strip() for line in lines[split + 1:] if not line.startswith("#")]
    before = [line.split("=")[0].strip() for line in lines[:split]]
    assert not set(before) & set(HARNESS), f"harness parameters {sorted(set(before) & set(HARNESS))} come " \
        "before the comment line that ends the technique's parameters"
    assert set(after) <= set(HARNESS), f"{sorted(set(after) - set(HARNESS))} come after the harness " \
        "comment: only the harness's parameters belong there"


def test_the_rules_above_can_fail(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('processes = 2\nratings_csv = None\n# harness\nmax_steps = None\n')
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell]
    path = tmp_path / "99_x.ipynb"
    nbformat.write(nb, str(path))
    with pytest.raises(AssertionError, match="precision"):
        test_shared_parameter_names(path)
    cell.source = cell.source.replace("# harness", 'precision = "auto"\n# harness')
    nbformat.write(nb, str(path))
    with pytest.raises(pytest.fail.Exception, match="ratings_csv"):
        test_shared_parameter_names(path)
    cell.source = cell.source.replace("ratings_csv", "data_dir")
    nbformat.write(nb, str(path))
    with pytest.raises(pytest.fail.Exception, match="data_dir: the gallery calls this 'data_path'"):
        test_shared_parameter_names(path)
    cell.source = cell.source.replace("data_dir", "data_path")
    nbformat.write(nb, str(path))
    test_shared_parameter_names(path)
    test_the_harness_parameters_come_last(path)
    cell.source = cell.source.replace("# harness\n", "") + "# harness\nseed = 0\n"
    nbformat.write(nb, str(path))
    with pytest.raises(AssertionError, match="max_steps.* come before the comment line"):
        test_the_harness_parameters_come_last(path)
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


HARNESS_CALLS = ("log_model(", "record_metrics(")   # the model logged to MLflow; the run's metrics recorded


def _harness_cell_problems(nb) -> list[str]:
    """Harness-only cells shown, or a check hidden: a reader sees the lesson and its proofs, not plumbing."""
    problems = []
    for index, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        hidden = cell.metadata.get("jupyter", {}).get("source_hidden", False)
        calls = [call for call in HARNESS_CALLS if call in cell.source]
        if calls and not hidden:
            problems.append(f"code cell {index} calls {calls} but is not collapsed "
                            '(metadata "jupyter": {"source_hidden": true})')
        if hidden and "assert " in cell.source:
            problems.append(f"code cell {index} is collapsed but asserts: a check stays in view")
    return problems


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem not in TRAINS_NOTHING], ids=lambda p: p.stem)
def test_harness_cells_are_collapsed_and_checks_are_not(path):
    nb = nbformat.read(str(path), as_version=4)
    assert any(call in c.source for c in nb.cells for call in HARNESS_CALLS), f"{path.name} logs nothing"
    problems = _harness_cell_problems(nb)
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_the_collapse_rule_can_fail():
    cell = nbformat.v4.new_code_cell("logged = log_model(model, 'x')\nloaded = logged.load()")
    nb = nbformat.v4.new_notebook(cells=[cell])
    assert "not collapsed" in _harness_cell_problems(nb)[0]
    cell.metadata["jupyter"] = {"source_hidden": True}
    assert _harness_cell_problems(nb) == []
    cell.source += "\nassert (loaded(x) == y).all()"
    assert "asserts" in _harness_cell_problems(nb)[0]
