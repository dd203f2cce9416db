"""A notebook's results against its reference runs, within tolerances with a stated false-alarm rate.

A training result is the same on every run of one machine, but not across machines: another
instruction set (AVX2, AVX-512, AMX), another oneDNN or BLAS kernel, another thread count rounds
differently, and training amplifies the difference. So the stored outputs cannot pin a loss or an mAP
to four decimals, and a bar alone (accuracy >= 0.95) misses a regression that stays above it. Each
notebook therefore checks its headline results against `notebooks/references/<notebook>.json`.

The file holds a few statistics per result: a number itself, and a curve as a whole (the mean of its
points and the mean of its last third, never point by point: a point-by-point maximum over a few runs
is exceeded by chance on most new machines). Each statistic has the mean of the fitting runs (seeds,
instruction sets, thread counts, machines) and a tolerance of k standard deviations, with k the Student-t
prediction bound for the number of runs at the false-alarm rate the file states (all notebooks together:
under 1% per `make test`). `benchmarks/reference_spread.py` fits the file, validates it on runs it was not
fitted to, and records a regression the check catches while the notebook's bars let it pass.

What the check prints depends only on the reference file, never on this run's numbers, so nbval can
compare it on any machine; a statistic outside its tolerance raises, naming the value, the reference
and the tolerance. The measured values travel in the output's metadata (not compared by nbval), where
the spread benchmark reads them.
"""

from __future__ import annotations

import json
import math
import os
import statistics as stats
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.display import show_text
from helpers.gallery.catalog import CATALOG, REFERENCES_DIR
from helpers.paths import ROOT
from helpers.plain import plain

REFERENCE_METADATA_KEY = "distributed_gallery_reference"  # the check's output metadata: what it measured
# "measure": record the results without comparing them (the spread benchmark fits the reference files so)
REFERENCE_MODE_ENV = "GALLERY_REFERENCE"
FORMAT = 2

# How a result becomes the statistics that are compared: a number is its own statistic; a curve is
# judged as a whole, by its mean (how fast it learned, all along) and by the mean of its last third
# (where it ended up).
# The whole suite's false alarms: under 1% of `make test` runs fail a healthy notebook by chance. Each
# notebook with a reference gets an equal share, and each of its statistics an equal share of that.
SUITE_FALSE_ALARM_RATE = 0.01
REFERENCE_NOTEBOOKS = sum(nb.reference is not None for nb in CATALOG)  # each has a reference file
# A tolerance never rests on a standard deviation below this share of the statistic's value: where every
# run agreed to the last digit (an accuracy of 1.0 in all of them), another machine may still differ.
SD_FLOOR = 0.005
MIN_RUNS = 5

SUMMARIES = {"value": "the value", "mean": "mean of the curve", "last_third": "mean of its last third"}


@dataclass(frozen=True)
class Outcome:
    """What the check concluded: compared (and passed), or why it did not compare."""

    compared: bool
    text: str
    measured: dict[str, Any]


def reference_path(notebook: str, references_dir: Path | None = None) -> Path:
    return (references_dir or REFERENCES_DIR) / f"{notebook}.json"


def statistic_name(result: str, summary: str) -> str:
    return result if summary == "value" else f"{result}:{summary}"


def summarize(value: Any) -> dict[str, float]:
    """The statistics of one result: {"value": x} for a number, {"mean", "last_third"} for a curve."""
    if isinstance(value, list):
        if not value:
            raise ValueError("a curve needs at least one point")
        third = value[-max(1, math.ceil(len(value) / 3)):]
        return {"mean": sum(value) / len(value), "last_third": sum(third) / len(third)}
    return {"value": float(value)}


def statistics(results: Mapping[str, Any]) -> dict[str, float]:
    """Every statistic of a run's results, by name ("loss:mean", "loss:last_third", "accuracy")."""
    out = {}
    for result, value in results.items():
        for summary, x in summarize(_numbers(value)).items():
            out[statistic_name(result, summary)] = x
    return out


def load_reference(notebook: str, references_dir: Path | None = None) -> dict[str, Any]:
    """The reference file of `notebook`, checked for the fields the comparison needs."""
    path = reference_path(notebook, references_dir)
    if not path.is_file():
        raise FileNotFoundError(
            f"{notebook} has no reference run ({path.relative_to(ROOT) if ROOT in path.parents else path}): "
            f"measure one with `python benchmarks/reference_spread.py {notebook} --fit ... --write`."
        )
    reference = json.loads(path.read_text())
    refit = f"rewrite it with `python benchmarks/reference_spread.py {notebook} --fit ... --write`"
    if reference.get("format") != FORMAT:
        raise ValueError(f"{path} is not a format-{FORMAT} reference file: {refit}.")
    for key in ("parameters", "results", "compared"):
        if not isinstance(reference.get(key), dict):
            raise ValueError(f"{path} has no {key!r} object: {refit}.")
    for name, spec in reference["compared"].items():
        result = name.split(":")[0]
        if result not in reference["results"]:
            raise ValueError(f"{path}: statistic {name!r} is of no result listed under 'results': {refit}.")
        tol, value = spec.get("abs"), spec.get("value")
        if not isinstance(value, (int, float)) or not isinstance(tol, (int, float)) or not tol > 0:
            raise ValueError(
                f"{path}: statistic {name!r} needs a number 'value' and a positive 'abs': {refit}.")
    return reference


def _numbers(value: Any) -> float | list[float]:
    """A result as the comparison takes it: a float, or a curve as a list of floats."""
    value = plain(value)
    if isinstance(value, dict):
        raise TypeError("a result must be a number or a sequence of numbers, not a mapping")
    if isinstance(value, list):
        return [float(v) for v in value]
    return float(value)


def parameters_differ(reference: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The parameters whose values differ between the reference run and this run (both ways)."""
    return [name for name in sorted(set(reference) | set(params))
            if name not in params or name not in reference
            or _parameter(reference[name]) != _parameter(params[name])]


def _parameter(value: Any) -> Any:
    """A parameter as a reference file stores it (tuples as lists, paths and unknown types as text); ints
    and floats then compare as numbers."""
    return plain(value, default=str)


def _shape(value: Any) -> int | None:
    """The number of points of a curve, None for a number."""
    return len(value) if isinstance(value, list) else None


def deviations(reference: Mapping[str, Any], measured: Mapping[str, Any]) -> dict[str, float]:
    """How far each compared statistic lies from the reference, as a share of its tolerance (> 1: outside).

    `measured` are plain results (numbers, curves) with the reference's names and shapes; a curve of
    another length than the reference's is not the same run at all (inf).
    """
    shapes = reference["results"]
    values = statistics({k: v for k, v in measured.items() if _shape(v) == shapes.get(k, {}).get("points")})
    return {
        name: (abs(values[name] - spec["value"]) / spec["abs"]) if name in values else math.inf
        for name, spec in reference["compared"].items()
    }


def describe(reference: Mapping[str, Any], notebook: str) -> str:
    """What the check prints: the reference file's statistics and tolerances, nothing of this run."""
    compared = reference["compared"]
    promise = reference.get("promise", {})
    rate, runs = promise.get("false_alarm_rate"), promise.get("fit_runs")
    header = f"Compared with the reference runs (notebooks/references/{notebook}.json"
    if rate is not None and runs is not None:
        header += (f"; a healthy run falls outside one of the tolerances below with probability under "
                   f"{rate:.2g}, fitted on {runs} runs: seeds, instruction sets, thread counts, CPUs")
    lines = [header + "):"]
    for name, spec in compared.items():
        result, _, summary = name.partition(":")
        what = f"{result}, {SUMMARIES[summary or 'value']}" if summary else result
        lines.append(f"  {what:<46} {spec['value']:>8.4g} ± {spec['abs']:.3g}")
    reported = reference.get("not_compared", {})
    if reported:
        lines.append("  shown in the file, not compared (their tolerance reaches past the notebook's own "
                     "bar): " + ", ".join(reported))
    return "\n".join(lines)


def compare(
    notebook: str, params: Mapping[str, Any], results: Mapping[str, Any], references_dir: Path | None = None
) -> Outcome:
    """Compare `results` with the reference; raise AssertionError on a statistic outside its tolerance."""
    measured = {name: _numbers(value) for name, value in results.items()}
    if os.environ.get(REFERENCE_MODE_ENV, "").strip().lower() == "measure":  # benchmarks/reference_spread.py
        return Outcome(
            False, f"Measuring ({REFERENCE_MODE_ENV}=measure): not compared with the reference run.", measured
        )
    try:
        reference = load_reference(notebook, references_dir)
    except FileNotFoundError as e:
        return Outcome(False, f"Not compared with a reference run: {e}", measured)
    differ = parameters_differ(reference["parameters"], params)
    if differ:
        shown = ", ".join(f"{k}={reference['parameters'].get(k, '(unset)')!r}" for k in differ[:4])
        return Outcome(
            False,
            f"Not compared with the reference run: it was measured at other parameters "
            f"({shown}{', ...' if len(differ) > 4 else ''}); the bars above still apply.",
            measured,
        )
    # At the reference's parameters the notebook must check what the reference holds (other parameters
    # may check less: a skipped pass has no results).
    expected = reference["results"]
    missing = sorted(set(expected) - set(measured))
    extra = sorted(set(measured) - set(expected))
    if missing or extra:
        raise ValueError(
            f"{notebook}'s reference lists {sorted(expected)} but the notebook checks {sorted(measured)}: "
            f"re-measure it with `python benchmarks/reference_spread.py {notebook} --fit ... --write`."
        )
    failures = []
    for name, points in ((n, spec.get("points")) for n, spec in expected.items()):
        if _shape(measured[name]) != points:
            got = f"a curve of {_shape(measured[name])} points" if _shape(measured[name]) else "a number"
            want = f"a curve of {points} points" if points else "a number"
            failures.append(f"{name}: {got}, where the reference run has {want}")
    if not failures:
        values = statistics(measured)
        for name, share in deviations(reference, measured).items():
            if share > 1 + 1e-12:
                spec = reference["compared"][name]
                result, _, summary = name.partition(":")
                what = f"{result} ({SUMMARIES[summary]})" if summary else result
                failures.append(f"{what}: {values[name]:.4g} is not within ±{spec['abs']:.3g} of the "
                                f"reference {spec['value']:.4g} ({share:.1f}x the tolerance)")
    text = describe(reference, notebook)
    if failures:
        raise AssertionError(
            f"{notebook} moved away from its reference runs:\n  "
            + "\n  ".join(failures)
            + f"\n\n{text}\nIf the change is intended, re-measure the reference: "
            f"python benchmarks/reference_spread.py {notebook} --fit ... --write"
        )
    return Outcome(True, text, measured)


def round_up(x: float, digits: int = 2) -> float:
    """Round up to `digits` significant digits, so a tolerance is never below what was computed."""
    if x <= 0 or not math.isfinite(x):
        return x
    exponent = math.floor(math.log10(x)) - digits + 1
    return round(math.ceil(x / 10**exponent - 1e-9) * 10**exponent, 12)


def prediction_factor(runs: int, alpha: float) -> float:
    """k such that a new run falls more than k sample deviations from the runs' mean with probability alpha.

    For n runs of a normal spread, (x_new - mean) / (s * sqrt(1 + 1/n)) follows Student's t with n - 1
    degrees of freedom: k = t(1 - alpha/2, n - 1) * sqrt(1 + 1/n). Few runs make k large (the spread
    itself is uncertain); that is the price of a stated rate.
    """
    from scipy.stats import t

    return float(t.ppf(1 - alpha / 2, runs - 1) * math.sqrt(1 + 1 / runs))


def fit(runs: list[dict[str, Any]], notebook_rate: float | None = None,
        report_only: Sequence[str] = ()) -> dict[str, Any]:
    """The reference file's "results", "compared", "not_compared" and "promise" from the fitting runs.

    `report_only` names statistics to keep out of the comparison (they are fitted and shown, not
    compared): those whose tolerance reaches past the notebook's own bar, so they guard nothing more.
    """
    good = [r for r in runs if r.get("results")]
    if len(good) < MIN_RUNS:
        raise ValueError(f"{len(good)} runs with results; a fit needs at least {MIN_RUNS}")
    notebook_rate = notebook_rate or SUITE_FALSE_ALARM_RATE / REFERENCE_NOTEBOOKS
    first = good[0]["results"]
    shapes = {name: {"points": _shape(v)} for name, v in first.items()}
    for r in good:
        got = {name: _shape(v) for name, v in r["results"].items()}
        if got != {name: s["points"] for name, s in shapes.items()}:
            raise ValueError(
                f"run {r['variant']} on {r.get('machine')} has other results than the first: {got}")
    names = [(result, summary) for result, v in first.items() for summary in summarize(v)]
    unknown = set(report_only) - {statistic_name(*n) for n in names}
    if unknown:
        raise ValueError(f"report_only names no statistic of these runs: {sorted(unknown)}")
    n = len(good)
    alpha = notebook_rate / (len(names) - len(report_only))
    k = prediction_factor(n, alpha)
    compared, not_compared = {}, {}
    for result, summary in names:
        xs = [summarize(r["results"][result])[summary] for r in good]
        mean, sd = stats.fmean(xs), stats.stdev(xs)
        tol = round_up(k * max(sd, SD_FLOOR * abs(mean), 1e-12))
        spec = {"value": mean, "abs": tol, "sd": sd}
        name = statistic_name(result, summary)
        if name in report_only:
            not_compared[name] = spec
        else:
            compared[name] = spec
    return {
        "results": shapes,
        "compared": compared,
        "not_compared": not_compared,
        "promise": {
            "false_alarm_rate": notebook_rate,
            "per_make_test": SUITE_FALSE_ALARM_RATE,
            "reference_notebooks": REFERENCE_NOTEBOOKS,
            "statistics": len(compared),
            "per_statistic": alpha,
            "fit_runs": n,
            "k": k,
            "rule": (
                f"Each statistic (a number; a curve's mean, and the mean of its last third) is compared "
                f"with the mean of the {n} fitting runs; its tolerance is k = {k:.3g} times their "
                f"standard deviation (at least {SD_FLOOR:g} x the statistic's value), rounded up to 2 "
                f"digits. k is Student's t prediction bound for {n} runs at a two-sided rate of "
                f"{alpha:.3g} per statistic: "
                f"{SUITE_FALSE_ALARM_RATE:g} per make test, shared by {REFERENCE_NOTEBOOKS} notebooks and "
                f"{len(compared)} statistics in this one (Bonferroni). It assumes a normal spread; the "
                f"validation runs test it on runs it was not fitted to."
            ),
        },
    }


def judge(reference: dict[str, Any], results: dict[str, Any]) -> dict[str, Any]:
    """One run against the fitted tolerances: its worst statistic and the share of its tolerance used."""
    shares = deviations(reference, results)
    worst = max(shares, key=lambda s: shares[s])
    return {"worst": worst, "share": round(shares[worst], 3), "passed": shares[worst] <= 1}


def repeats_a_fitting_run(reference: Mapping[str, Any], run: Mapping[str, Any]) -> bool:
    """Whether `run` gave exactly the results of one of the fitting runs (the same CPU type and variant in
    another session does): such a run tests nothing about the fit and is not a held-out run."""
    if not run.get("results"):
        return False
    mine = statistics(run["results"])
    for fitted in reference.get("fit", {}).get("runs", []):
        if fitted.get("results"):
            theirs = statistics(fitted["results"])
            if theirs.keys() == mine.keys() and all(abs(theirs[k] - mine[k]) < 1e-9 for k in mine):
                return True
    return False


def _short_machine(machine: str) -> str:
    return machine.split(",")[0].replace("(R)", "").replace(" Processor", "").strip()


def validation_table(notebooks: Sequence[str], references_dir: Path | None = None) -> tuple[str, bool]:
    """Every held-out and guard run of the reference files, judged again (markdown), and whether all held.

    A held-out run holds when it passes; a guard run (the file's named regression) when it fails, unless the
    file says (`too_wide`) that its spread is too wide for that regression and every subtler one. The share
    is how much of its tolerance the run's worst statistic used (1.00 is the bound). A run that one of the
    notebook's own bars stopped never reached the comparison: it is listed, and judged by nothing here.
    """
    lines = ["| notebook | fit runs | k | run: machine, variant | worst statistic | share of its tolerance "
             "| verdict |", "|---|---|---|---|---|---|---|"]
    ok = True
    for stem in notebooks:
        ref = load_reference(stem, references_dir)
        promise = ref["promise"]
        rows = [(r, "held out") for r in ref.get("validation", {}).get("runs", [])]
        rows += [(r, "guard") for r in ref.get("guard", {}).get("runs", [])]
        for run, role in rows:
            if not run.get("results"):  # it stopped at one of the notebook's own bars: no reference verdict
                error = str(run.get("error")).split("AssertionError: ")[-1]
                lines.append(f"| {stem} | {promise['fit_runs']} | {promise['k']:.2f} | "
                             f"{_short_machine(run['machine'])}, {run['variant']} | - | - | "
                             f"stopped by a bar before the comparison: {error} |")
                continue
            verdict = judge(ref, run["results"])
            too_wide = role == "guard" and bool(ref["guard"].get("too_wide"))  # the file says it passes
            holds = verdict["passed"] if role == "held out" or too_wide else not verdict["passed"]
            ok &= holds
            label = run["variant"] if role == "held out" else f"guard: {ref['guard']['regression']}"
            shown = ("passes" if verdict["passed"] else "fails") + ("" if holds else " (WRONG)")
            shown += " (within its spread, as the file says)" if too_wide else ""
            lines.append(f"| {stem} | {promise['fit_runs']} | {promise['k']:.2f} | "
                         f"{_short_machine(run['machine'])}, {label} | {verdict['worst']} | "
                         f"{verdict['share']:.2f} | {shown} |")
    return "\n".join(lines), ok


def check_against_reference(notebook: str, params: Mapping[str, Any], **results: Any) -> Outcome:
    """Check a notebook's headline results against its reference runs and show the outcome.

    `params` are the conditions of this run (the parameters cell, with `processes` and `device` as
    resolved); at other parameters than the reference's, nothing is compared and the notebook's bars
    are the only checks. Results are numbers or curves (sequences of numbers, judged as a whole).
    """
    outcome = compare(notebook, params, results)
    meta = {
        REFERENCE_METADATA_KEY: {
            "notebook": notebook,
            "compared": outcome.compared,
            "measured": outcome.measured,
            "params": {k: _parameter(v) for k, v in params.items()},
        }
    }
    show_text(outcome.text, meta)
    return outcome
