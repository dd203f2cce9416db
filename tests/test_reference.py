"""The reference check: it passes within tolerance, fails outside it, and prints only what holds anywhere."""

import json

import pytest

from helpers import reference
from helpers.reference import compare, load_reference


def _write(tmp_path, **results):
    ref = {
        "notebook": "nb",
        "parameters": {"processes": 2, "device": "cpu", "lr": 0.1},
        "results": results,
        "measured": {"runs": {"a": {}, "b": {}, "c": {}}},
    }
    (tmp_path / "nb.json").write_text(json.dumps(ref))
    return tmp_path


PARAMS = {"processes": 2, "device": "cpu", "lr": 0.1}


def test_within_tolerance_passes_and_prints_only_reference_values(tmp_path):
    refs = _write(
        tmp_path, accuracy={"value": 0.97, "abs": 0.02}, loss={"value": [2.0, 1.0, 0.5], "abs": 0.1}
    )
    a = compare("nb", PARAMS, {"accuracy": 0.958, "loss": [2.05, 0.95, 0.55]}, refs)
    b = compare("nb", PARAMS, {"accuracy": 0.981, "loss": [1.95, 1.0, 0.45]}, refs)
    assert a.compared and b.compared
    assert a.text == b.text  # nbval compares this text: it must not depend on the run
    assert "0.97" in a.text and "3-point curve" in a.text and "3 runs" in a.text, a.text
    assert a.measured == {"accuracy": 0.958, "loss": [2.05, 0.95, 0.55]}


def test_outside_tolerance_fails_with_the_numbers(tmp_path):
    refs = _write(tmp_path, accuracy={"value": 0.97, "abs": 0.02})
    with pytest.raises(AssertionError, match=r"accuracy: 0.93 is not within ±0.02 of the reference 0.97"):
        compare("nb", PARAMS, {"accuracy": 0.93}, refs)


def test_a_curve_that_stopped_learning_fails(tmp_path):
    refs = _write(tmp_path, loss={"value": [2.3, 1.0, 0.2], "abs": 0.15})
    with pytest.raises(
        AssertionError, match="point 3 of the curve is 2.3, not within ±0.15 of the reference 0.2"
    ):
        compare("nb", PARAMS, {"loss": [2.3, 2.3, 2.3]}, refs)
    with pytest.raises(AssertionError, match="a curve of 2 points is not the reference's 3-point curve"):
        compare("nb", PARAMS, {"loss": [2.3, 1.0]}, refs)


def test_per_point_tolerances_are_tight_where_runs_agree(tmp_path):
    """Late epochs vary less than early ones: a late drift fails even when it is small."""
    refs = _write(tmp_path, loss={"value": [2.3, 1.0, 0.2], "abs": [0.3, 0.1, 0.02]})
    assert compare("nb", PARAMS, {"loss": [2.55, 0.92, 0.21]}, refs).compared
    with pytest.raises(
        AssertionError, match="point 3 of the curve is 0.25, not within ±0.02 of the reference 0.2"
    ):
        compare("nb", PARAMS, {"loss": [2.3, 1.0, 0.25]}, refs)
    (tmp_path / "nb.json").write_text(
        json.dumps({"parameters": PARAMS, "results": {"loss": {"value": [1.0, 2.0], "abs": [0.1]}}})
    )
    with pytest.raises(ValueError, match="one number per point"):
        load_reference("nb", tmp_path)


def test_other_parameters_are_not_compared(tmp_path):
    refs = _write(tmp_path, accuracy={"value": 0.97, "abs": 0.02})
    out = compare("nb", dict(PARAMS, lr=0.0), {"accuracy": 0.1}, refs)
    assert not out.compared and "lr=0.1" in out.text
    out = compare("nb", dict(PARAMS, processes=8), {"accuracy": 0.1}, refs)
    assert not out.compared and "processes=2" in out.text
    # a tuple parameter equals the list JSON stored
    refs = tmp_path / "t"
    refs.mkdir()
    (refs / "nb.json").write_text(
        json.dumps({"parameters": {"ratios": [1.0]}, "results": {"x": {"value": 1.0, "abs": 0.0}}})
    )
    assert compare("nb", {"ratios": (1.0,)}, {"x": 1.0}, refs).compared


def test_results_must_match_the_reference_names(tmp_path):
    refs = _write(tmp_path, accuracy={"value": 0.97, "abs": 0.02})
    with pytest.raises(ValueError, match="reference_spread.py nb --write"):
        compare("nb", PARAMS, {"accuracy": 0.97, "loss": 1.0}, refs)


def test_missing_or_broken_reference(tmp_path):
    out = compare("nb", PARAMS, {"accuracy": 0.97}, tmp_path)
    assert not out.compared and "reference_spread.py nb --write" in out.text
    (tmp_path / "nb.json").write_text(json.dumps({"parameters": {}, "results": {"a": {"value": 1}}}))
    with pytest.raises(ValueError, match="'abs' tolerance"):
        load_reference("nb", tmp_path)


def test_every_notebook_has_a_reference_it_checks():
    """Each notebook calls check_against_reference with its own name, and its reference file exists."""
    import nbformat

    from helpers.paths import NOTEBOOKS_DIR

    for path in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")):
        cells = nbformat.read(str(path), as_version=4).cells
        source = "\n".join(c.source for c in cells if c.cell_type == "code")
        assert f'check_against_reference("{path.stem}"' in source, f"{path.name} does not check its reference"
        ref = load_reference(path.stem)
        assert ref["results"], f"{path.stem}'s reference has no results"
        assert len(ref["measured"]["runs"]) >= 3, f"{path.stem}'s tolerances come from fewer than 3 runs"
        assert reference.reference_path(path.stem).parent == reference.REFERENCES_DIR
