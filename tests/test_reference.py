"""The reference check: its stated false-alarm rate holds, it fails outside tolerance, it prints only what
holds anywhere, and every notebook's file was validated on held-out runs and guards a named regression."""

import json
import random
import re

import pytest

from helpers import reference
from helpers.reference import (
    FORMAT,
    MIN_RUNS,
    compare,
    fit,
    judge,
    load_reference,
    prediction_factor,
    repeats_a_fitting_run,
    round_up,
    statistics,
)

PARAMS = {"processes": 2, "device": "cpu", "lr": 0.1}

# Notebooks whose training is the noisiest: five held-out runs each, three for the rest.
NOISIEST = {"02_ddp_retinanet", "06_ray_train_resnet", "09_axolotl_olmo3"}


def _runs(n=8, seed=0, accuracy_sd=0.004, loss_sd=0.02):
    rng = random.Random(seed)
    runs = []
    for i in range(n):
        shift = rng.gauss(0, loss_sd)
        runs.append({"variant": f"seed{i}", "machine": "test", "results": {
            "accuracy": 0.97 + rng.gauss(0, accuracy_sd),
            "loss": [2.0 + shift, 1.0 + shift, 0.5 + shift, 0.4 + shift, 0.3 + shift, 0.25 + shift]}})
    return runs


def _write(tmp_path, runs=None, **extra):
    ref = {"notebook": "nb", "format": FORMAT, "parameters": PARAMS, **fit(runs or _runs()), **extra}
    (tmp_path / "nb.json").write_text(json.dumps(ref))
    return tmp_path


def test_statistics_judge_a_curve_as_a_whole():
    got = statistics({"loss": [4.0, 2.0, 1.0, 1.0, 0.5, 0.5], "accuracy": 0.9})
    assert got == {"loss:mean": 1.5, "loss:last_third": 0.5, "accuracy": 0.9}
    assert statistics({"c": [3.0, 1.0]}) == {"c:mean": 2.0, "c:last_third": 1.0}


def test_fit_states_its_rate_and_tolerances_scale_with_the_spread(tmp_path):
    fitted = fit(_runs())
    promise = fitted["promise"]
    assert promise["statistics"] == 3 and promise["fit_runs"] == 8
    assert promise["per_statistic"] == pytest.approx(promise["false_alarm_rate"] / 3)
    assert promise["k"] == pytest.approx(prediction_factor(8, promise["per_statistic"]))
    assert set(fitted["compared"]) == {"accuracy", "loss:mean", "loss:last_third"}
    wide = fit(_runs(loss_sd=0.04))["compared"]["loss:mean"]["abs"]
    assert 1.7 < wide / fitted["compared"]["loss:mean"]["abs"] < 2.3
    # every run agreeing to the last digit still leaves a floor: another machine may differ
    same = [{"variant": str(i), "machine": "t", "results": {"accuracy": 1.0}} for i in range(6)]
    assert fit(same)["compared"]["accuracy"]["abs"] >= 0.005 * prediction_factor(6, 0.001)
    with pytest.raises(ValueError, match=f"at least {MIN_RUNS}"):
        fit(_runs(n=MIN_RUNS - 1))


def test_the_false_alarm_rate_holds_on_new_draws():
    """Fit on draws of a normal spread, then judge fresh draws: the rate of false failures is the one stated
    (here raised to 10% per file so that a few thousand trials measure it)."""
    rng = random.Random(1)
    trials, failed = 3000, 0
    for _ in range(trials):
        def draw():
            return {"a": rng.gauss(1.0, 0.05), "b": rng.gauss(0.5, 0.02)}
        runs = [{"variant": str(i), "machine": "t", "results": draw()} for i in range(6)]
        ref = fit(runs, notebook_rate=0.1)
        failed += not judge(ref, draw())["passed"]
    assert 0.06 < failed / trials < 0.14, failed / trials


def test_within_tolerance_passes_and_prints_only_reference_values(tmp_path):
    refs = _write(tmp_path)
    a = compare("nb", PARAMS, {"accuracy": 0.965, "loss": [2.02, 1.02, 0.52, 0.41, 0.31, 0.26]}, refs)
    b = compare("nb", PARAMS, {"accuracy": 0.975, "loss": [1.98, 0.99, 0.49, 0.4, 0.29, 0.24]}, refs)
    assert a.compared and b.compared
    assert a.text == b.text  # nbval compares this text: it must not depend on the run
    assert "loss, mean of its last third" in a.text and "8 runs" in a.text and "0.001" in a.text, a.text
    assert a.measured["accuracy"] == 0.965


def test_outside_tolerance_fails_with_the_numbers(tmp_path):
    refs = _write(tmp_path)
    tol = load_reference("nb", refs)["compared"]["accuracy"]["abs"]
    with pytest.raises(AssertionError, match=rf"accuracy: 0.5 is not within ±{tol:.3g} of the reference 0.9"):
        compare("nb", PARAMS, {"accuracy": 0.5, "loss": [2.0, 1.0, 0.5, 0.4, 0.3, 0.25]}, refs)


def test_a_curve_that_stopped_learning_fails(tmp_path):
    refs = _write(tmp_path)
    with pytest.raises(AssertionError, match=r"loss \(mean of its last third\): 0.5 is not within"):
        compare("nb", PARAMS, {"accuracy": 0.97, "loss": [2.0, 1.0, 0.5, 0.5, 0.5, 0.5]}, refs)
    with pytest.raises(AssertionError, match="loss: a curve of 2 points, where the reference run has a"):
        compare("nb", PARAMS, {"accuracy": 0.97, "loss": [2.3, 1.0]}, refs)


def test_one_point_off_its_own_spread_does_not_fail_a_curve(tmp_path):
    """The failure this issue reported: one point of eight a little beyond what a few runs showed there."""
    refs = _write(tmp_path)
    assert compare("nb", PARAMS, {"accuracy": 0.97, "loss": [2.0, 0.92, 0.5, 0.4, 0.3, 0.25]}, refs).compared


def test_other_parameters_are_not_compared(tmp_path):
    refs = _write(tmp_path)
    out = compare("nb", dict(PARAMS, lr=0.0), {"accuracy": 0.1}, refs)
    assert not out.compared and "lr=0.1" in out.text
    out = compare("nb", dict(PARAMS, processes=8), {"accuracy": 0.1}, refs)
    assert not out.compared and "processes=2" in out.text
    ref = json.loads((refs / "nb.json").read_text())
    (refs / "nb.json").write_text(json.dumps(dict(ref, parameters={**PARAMS, "ratios": [1.0]})))
    good = {"accuracy": 0.97, "loss": [2.0, 1.0, 0.5, 0.4, 0.3, 0.25]}
    assert compare("nb", dict(PARAMS, ratios=(1.0,)), good, refs).compared  # a tuple equals JSON's list


def test_results_must_match_the_reference_names(tmp_path):
    refs = _write(tmp_path)
    with pytest.raises(ValueError, match="reference_spread.py nb --fit"):
        compare("nb", PARAMS, {"accuracy": 0.97, "loss": [1.0] * 6, "extra": 1.0}, refs)


def test_missing_old_or_broken_reference(tmp_path):
    out = compare("nb", PARAMS, {"accuracy": 0.97}, tmp_path)
    assert not out.compared and "reference_spread.py nb --fit" in out.text
    old = {"parameters": {}, "results": {"a": {"value": 1, "abs": 1}}}
    (tmp_path / "nb.json").write_text(json.dumps(old))
    with pytest.raises(ValueError, match="not a format-2 reference file"):
        load_reference("nb", tmp_path)
    ref = {"format": FORMAT, "parameters": {}, "results": {"a": {"points": None}},
           "compared": {"a": {"value": 1.0, "abs": 0}}}
    (tmp_path / "nb.json").write_text(json.dumps(ref))
    with pytest.raises(ValueError, match="positive 'abs'"):
        load_reference("nb", tmp_path)


def test_a_run_that_repeats_a_fitting_run_is_not_held_out(tmp_path):
    runs = _runs()
    ref = {"fit": {"runs": runs}}
    assert repeats_a_fitting_run(ref, dict(runs[3], variant="native"))
    moved = dict(runs[3], results=dict(runs[3]["results"], accuracy=runs[3]["results"]["accuracy"] + 1e-6))
    assert not repeats_a_fitting_run(ref, moved)
    assert not repeats_a_fitting_run(ref, {"variant": "seed9", "results": None})


def test_round_up_never_narrows():
    assert round_up(0.01234) == 0.013 and round_up(0.012) == 0.012 and round_up(2.01) == 2.1


def _notebook_stems():
    """Every notebook that trains (tests/conftest.py) has its reference; the launcher's tour has none."""
    from tests.support import training_notebooks

    return [p.stem for p in training_notebooks()]


@pytest.mark.parametrize("stem", _notebook_stems())
def test_every_notebook_checks_a_validated_reference_that_guards(stem):
    """Each notebook checks its reference; the file was fitted on enough runs, every held-out run (other
    seeds, instruction sets, thread counts, machines) passes it, and its named regression fails it although
    the notebook's bars let that run through (it recorded results, which a failing bar prevents)."""
    import nbformat

    from helpers.paths import NOTEBOOKS_DIR

    cells = nbformat.read(str(NOTEBOOKS_DIR / f"{stem}.ipynb"), as_version=4).cells
    source = "\n".join(c.source for c in cells if c.cell_type == "code")
    assert f'check_against_reference("{stem}"' in source, f"{stem} does not check its reference"
    ref = load_reference(stem)
    assert reference.reference_path(stem).parent == reference.REFERENCES_DIR
    assert ref["compared"], f"{stem}'s reference compares nothing"
    fit_runs = [r for r in ref["fit"]["runs"] if r["results"]]
    assert len(fit_runs) >= MIN_RUNS and ref["promise"]["fit_runs"] == len(fit_runs)
    kinds = {(r["machine"], part) for r in fit_runs for part in r["variant"].split("+")
             if not part.startswith("seed")}
    assert len(kinds) >= 2, f"{stem} was fitted under one arithmetic: add instruction-set or thread variants"
    refitted = fit(fit_runs, report_only=ref["fit"].get("report_only", []))
    assert refitted["compared"] == ref["compared"], f"{stem}'s tolerances are not what its runs give: refit"
    held_out = [r for r in ref["validation"]["runs"] if r["results"]]  # a run a bar stopped has no verdict
    assert len(held_out) >= (5 if stem in NOISIEST else 3), f"{stem}: too few held-out runs"
    for run in held_out:  # held out: no fitting run gave these results (the same CPU type, another session)
        assert not repeats_a_fitting_run(ref, run), f"{stem}: held-out {run['variant']} repeats a fitting run"
        verdict = judge(ref, run["results"])
        assert verdict["passed"], f"{stem}: held-out {run['variant']} on {run['machine']} fails: {verdict}"
    guard = ref["guard"]
    assert guard["regression"] and guard["runs"], f"{stem} names no regression its reference check catches"
    for run in guard["runs"]:
        assert run["results"] and not run["error"], f"{stem}: the guard run failed a bar: it is no guard"
        if guard.get("too_wide"):  # the file says why no regression subtle enough for the bars is caught
            assert judge(ref, run["results"])["passed"], f"{stem}: its guard is caught: drop 'too_wide'"
            continue
        with pytest.raises(AssertionError, match="moved away from its reference runs"):
            compare(stem, ref["parameters"], run["results"])


def test_a_loosened_reference_lets_the_guard_through(tmp_path, monkeypatch):
    """The guard test above can fail: with every tolerance widened tenfold, 01's regression passes."""
    ref = load_reference("01_ddp_mlp")
    for spec in ref["compared"].values():
        spec["abs"] *= 10
    (tmp_path / "01_ddp_mlp.json").write_text(json.dumps(ref))
    guard_run = ref["guard"]["runs"][0]["results"]
    assert compare("01_ddp_mlp", ref["parameters"], guard_run, tmp_path).compared


def test_the_reported_failure_is_admitted():
    """The failure that made `make test` red on an AMD EPYC (Zen 4): 02 under its nbval variant there gave
    0.4799 at point 2 of the box-regression curve. That run is one of 02's held-out runs, and passes."""
    ref = load_reference("02_ddp_retinanet")
    observed = [r for r in ref["validation"]["runs"]
                if "AMD EPYC" in r["machine"] and r["variant"] == "avx2+threads1"]
    assert observed, "02's validation lacks the AMD EPYC avx2 run"
    point = observed[0]["results"]["bbox_regression_loss"][1]
    assert round(point, 4) == 0.4799
    # the point-by-point rule it failed: the old reference's 0.4945 ± 0.011 there (the numbers)
    assert abs(point - 0.4945) > 0.011
    assert judge(ref, observed[0]["results"])["passed"]


def test_the_docs_table_is_the_files_table():
    """docs/reference-check.md shows every held-out and guard run as the files judge them now."""
    from helpers.paths import ROOT
    from helpers.reference import validation_table

    page = (ROOT / "docs" / "reference-check.md").read_text()
    shown = re.search(r"<!-- reference-table -->\n(.*?)\n<!-- /reference-table -->", page, re.S)
    table, ok = validation_table(_notebook_stems())
    assert ok, table
    assert shown and shown.group(1) == table, (
        "docs/reference-check.md's table is stale: python benchmarks/reference_spread.py --table --write")


def test_the_readme_states_the_promise():
    from helpers.paths import ROOT

    text = " ".join((ROOT / "README.md").read_text().split())
    assert "less than once in a hundred `make test` runs" in text and "docs/reference-check.md" in text


def test_the_map_range_02_quotes_is_its_reference_files():
    """Notebook 02 explains its bar by the mAP@0.5 its reference runs scored: it quotes the file's range."""
    import nbformat

    from helpers.paths import NOTEBOOKS_DIR

    ref = load_reference("02_ddp_retinanet")
    scores = [r["results"]["map_50"] for r in ref["fit"]["runs"] + ref["validation"]["runs"] if r["results"]]
    quoted = f"{min(scores):.2f} to {max(scores):.2f}"
    cells = nbformat.read(str(NOTEBOOKS_DIR / "02_ddp_retinanet.ipynb"), as_version=4).cells
    text = " ".join(" ".join(c.source.split()) for c in cells)
    assert f"scored {quoted}" in text, f"02 should quote the mAP@0.5 range of its reference runs: {quoted}"



def _comparison_problem(nb, stem: str) -> str | None:
    """Why `nb`'s outputs do not show its results compared with its reference, or None."""
    from helpers.gallery.notebook_io import outputs

    said = [str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
            for _, _, out in outputs(nb)]
    not_compared = [text.strip()[:200] for text in said if "Not compared with" in text]
    if not_compared or not any("Compared with the reference runs" in text for text in said):
        return (f"{stem}'s stored run was not compared with notebooks/references/{stem}.json "
                f"({not_compared or 'no comparison in its outputs'}): refit the reference at the notebook's "
                f"defaults (benchmarks/reference_spread.py {stem[:2]} --fit ... --write), then store it")
    return None


@pytest.mark.parametrize("stem", _notebook_stems())
def test_the_stored_run_was_compared_with_its_reference(stem):
    """A notebook is stored from a run at its defaults, where its reference was measured: a recipe changed
    without a refit would turn the comparison off ("measured at other parameters") without any failure."""
    import nbformat

    from helpers.paths import NOTEBOOKS_DIR

    problem = _comparison_problem(nbformat.read(str(NOTEBOOKS_DIR / f"{stem}.ipynb"), as_version=4), stem)
    assert problem is None, problem


def test_a_stored_run_at_other_parameters_is_found():
    import nbformat.v4 as v4

    said = "Not compared with the reference run: it was measured at other parameters (epochs=4); ..."
    nb = v4.new_notebook(cells=[v4.new_code_cell("check()", outputs=[v4.new_output("stream", text=said)])])
    assert "measured at other parameters" in _comparison_problem(nb, "05_deepspeed_zero_sft")
    nb.cells[0].outputs = [v4.new_output("stream", text="Compared with the reference runs (notebooks/...)")]
    assert _comparison_problem(nb, "05_deepspeed_zero_sft") is None


def test_a_kept_run_of_other_code_is_not_reused(tmp_path, monkeypatch):
    """--reuse reads a kept run only where it executed the same code: a run of another guard's mutation, or of
    the notebook before an edit, would otherwise judge the wrong recipe."""
    import importlib.util

    import nbformat
    import nbformat.v4 as v4

    from helpers.paths import ROOT

    path = ROOT / "benchmarks" / "reference_spread.py"
    spec = importlib.util.spec_from_file_location("reference_spread", path)
    spread = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(spread)
    notebook = tmp_path / "nb.ipynb"
    nbformat.write(v4.new_notebook(cells=[v4.new_code_cell("lr = 0.1")]), str(notebook))
    kept = tmp_path / "kept"
    kept.mkdir()
    injected = v4.new_code_cell("seed = 1")
    injected.metadata["tags"] = ["injected-parameters"]
    run = kept / "nb-native.ipynb"
    nbformat.write(v4.new_notebook(cells=[injected, v4.new_code_cell("lr = 0.1")]), str(run))
    assert spread.same_code(run, notebook)   # the injected parameters aside
    nbformat.write(v4.new_notebook(cells=[v4.new_code_cell("lr = 0.1 / 3")]), str(notebook))
    assert not spread.same_code(run, notebook)
    ran = []
    monkeypatch.setattr("helpers.gallery.execute.execute_notebook",
                        lambda nb, out, params, timeout: ran.append(nb))
    monkeypatch.setattr(spread, "reference_values", lambda out: {"measured": {"loss": 1.0}})
    spread.run_variant(notebook, "native", kept, reuse=True)
    assert ran == [notebook], "a kept run of other code stood in for this notebook's run"
