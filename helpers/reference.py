"""A notebook's results against its reference run, within tolerances measured across machines.

A training result is the same on every run of one machine, but not across machines: another
instruction set (AVX2, AVX-512, AMX), another oneDNN or BLAS kernel, another thread count rounds
differently, and training amplifies the difference. So the stored outputs cannot pin a loss or an mAP
to four decimals (nbval would fail on every machine but the one that stored them), and a bar alone
(accuracy >= 0.95) misses a regression that stays above it. Each notebook therefore checks its
headline results against `notebooks/references/<notebook>.json`: the values of a reference run at the
default parameters, each with a tolerance chosen from the spread measured over runs on other
instruction sets, thread counts and seeds (`benchmarks/reference_spread.py` measures it and writes the
file, with the measurement next to the tolerances).

What the check prints depends only on the reference file, never on this run's numbers, so nbval can
compare it on any machine; a result outside its tolerance raises, naming the value, the reference and
the tolerance. The measured values travel in the output's metadata (not compared by nbval), where the
spread benchmark reads them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.paths import ROOT

REFERENCES_DIR = ROOT / "notebooks" / "references"
METADATA_KEY = "distributed_gallery_reference"
ENV_SWITCH = "GALLERY_REFERENCE"  # "measure": record the results without comparing (the spread benchmark)


@dataclass(frozen=True)
class Outcome:
    """What the check concluded: compared (and passed), or why it did not compare."""

    compared: bool
    text: str
    measured: dict[str, Any]


def reference_path(notebook: str, references_dir: Path | None = None) -> Path:
    return (references_dir or REFERENCES_DIR) / f"{notebook}.json"


def load_reference(notebook: str, references_dir: Path | None = None) -> dict[str, Any]:
    """The reference file of `notebook`, checked for the fields the comparison needs."""
    path = reference_path(notebook, references_dir)
    if not path.is_file():
        raise FileNotFoundError(
            f"{notebook} has no reference run ({path.relative_to(ROOT) if ROOT in path.parents else path}): "
            f"measure one with `python benchmarks/reference_spread.py {notebook} --write`."
        )
    reference = json.loads(path.read_text())
    for key in ("parameters", "results"):
        if not isinstance(reference.get(key), dict):
            raise ValueError(f"{path} has no {key!r} object: rewrite it with benchmarks/reference_spread.py.")
    for name, spec in reference["results"].items():
        tol, value = spec.get("abs"), spec.get("value")
        per_point = isinstance(tol, list) and isinstance(value, list) and len(tol) == len(value)
        if (
            value is None
            or not (per_point or isinstance(tol, (int, float)))
            or min(tol if per_point else [tol], default=0) < 0
        ):
            raise ValueError(
                f"{path}: result {name!r} needs a 'value' and a non-negative 'abs' tolerance "
                "(a number, or for a curve one number per point)."
            )
    return reference


def _plain(value: Any) -> Any:
    """Floats, or lists of floats, from numpy / torch / pandas values."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Mapping):
        raise TypeError("a result must be a number or a sequence of numbers, not a mapping")
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [float(v) for v in value]
    return float(value)


def _format_value(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)}-point curve"
    return f"{value:.4g}"


def _excess(measured: Any, reference: Any, tolerance: Any) -> tuple[float, int | None]:
    """How far the result lies beyond its tolerance (<= 0: within), and at which point of a curve.

    A curve is compared point by point, against one tolerance or one per point (early epochs move
    more between runs than late ones); a curve of another length is not the same run at all.
    """
    if isinstance(reference, list) != isinstance(measured, list):
        return math.inf, None
    if not isinstance(reference, list):
        return abs(measured - reference) - tolerance, None
    if len(reference) != len(measured):
        return math.inf, None
    tolerances = tolerance if isinstance(tolerance, list) else [tolerance] * len(reference)
    worst, where = -math.inf, None
    for i, (m, r, t) in enumerate(zip(measured, reference, tolerances, strict=True)):
        if abs(m - r) - t > worst:
            worst, where = abs(m - r) - t, i
    return (worst if where is not None else 0.0), where


def _format_tolerance(tolerance: Any) -> str:
    if isinstance(tolerance, list):
        return f"{min(tolerance):.2g}..{max(tolerance):.2g}" if tolerance else "-"
    return f"{tolerance:.3g}"


def parameters_differ(reference: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The parameters whose values differ between the reference run and this run (both ways)."""
    different = []
    for name in sorted(set(reference) | set(params)):
        if name not in params or name not in reference or _canon(reference[name]) != _canon(params[name]):
            different.append(name)
    return different


def _canon(value: Any) -> Any:
    """Parameters as JSON would store them (tuples as lists, ints and floats compared as numbers)."""
    return json.loads(json.dumps(value, default=str))


def compare(
    notebook: str, params: Mapping[str, Any], results: Mapping[str, Any], references_dir: Path | None = None
) -> Outcome:
    """Compare `results` with the reference; raise AssertionError on a result outside its tolerance."""
    measured = {name: _plain(value) for name, value in results.items()}
    if os.environ.get(ENV_SWITCH, "").strip().lower() == "measure":  # benchmarks/reference_spread.py
        return Outcome(
            False, f"Measuring ({ENV_SWITCH}=measure): not compared with the reference run.", measured
        )
    try:
        reference = load_reference(notebook, references_dir)
    except FileNotFoundError as e:
        return Outcome(False, f"Not compared with a reference run: {e}", measured)
    expected = reference["results"]
    differ = parameters_differ(reference["parameters"], {k: _json_value(v) for k, v in params.items()})
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
    missing = sorted(set(expected) - set(measured))
    extra = sorted(set(measured) - set(expected))
    if missing or extra:
        raise ValueError(
            f"{notebook}'s reference lists {sorted(expected)} but the notebook checks {sorted(measured)}: "
            f"re-measure it with `python benchmarks/reference_spread.py {notebook} --write`."
        )
    failures, lines = [], []
    for name, spec in expected.items():
        excess, point = _excess(measured[name], spec["value"], spec["abs"])
        within = excess <= 1e-12
        lines.append(
            f"  {name:<24} {_format_value(spec['value']):>16} ± {_format_tolerance(spec['abs']):<12} "
            f"{'ok' if within else 'OUTSIDE'}"
        )
        if not within:
            if point is None and isinstance(spec["value"], list):
                failures.append(
                    f"{name}: a curve of {len(measured[name]) if isinstance(measured[name], list) else 1}"
                    f" points is not the reference's {_format_value(spec['value'])}"
                )
            elif point is None:
                failures.append(
                    f"{name}: {_format_value(measured[name])} is not within ±{spec['abs']:.4g} of the "
                    f"reference {_format_value(spec['value'])}"
                )
            else:
                tol = spec["abs"][point] if isinstance(spec["abs"], list) else spec["abs"]
                failures.append(
                    f"{name}: point {point + 1} of the curve is {measured[name][point]:.4g}, not within "
                    f"±{tol:.4g} of the reference {spec['value'][point]:.4g}"
                )
    runs = reference.get("measured", {}).get("runs", {})
    header = (
        f"Compared with the reference run (notebooks/references/{notebook}.json; tolerances from "
        f"{len(runs)} runs across instruction sets, thread counts and seeds):"
    )
    text = "\n".join([header, *lines])
    if failures:
        raise AssertionError(
            f"{notebook} moved away from its reference run:\n  "
            + "\n  ".join(failures)
            + f"\n\n{text}\nIf the change is intended, re-measure the reference: "
            f"python benchmarks/reference_spread.py {notebook} --write"
        )
    return Outcome(True, text, measured)


def _json_value(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, Path):
        return str(value)
    return value


def check_against_reference(notebook: str, params: Mapping[str, Any], **results: Any) -> Outcome:
    """Check a notebook's headline results against its reference run and show the outcome.

    `params` are the conditions of this run (the parameters cell, with `processes` and `device` as
    resolved); at other parameters than the reference's, nothing is compared and the notebook's bars
    are the only checks. Results are numbers or curves (sequences of numbers, compared point by point).
    """
    outcome = compare(notebook, params, results)
    meta = {
        METADATA_KEY: {
            "notebook": notebook,
            "compared": outcome.compared,
            "measured": outcome.measured,
            "params": {k: _json_value(v) for k, v in params.items()},
        }
    }
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display({"text/plain": outcome.text}, raw=True, metadata=meta)
            return outcome
    except ImportError:
        pass
    print(outcome.text)
    return outcome


def measured_values(nb: Any) -> dict[str, Any] | None:
    """What `check_against_reference` measured in an executed notebook (None if it did not run)."""
    import nbformat

    if not isinstance(nb, nbformat.NotebookNode):
        nb = nbformat.read(str(nb), as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            found = out.get("metadata", {}).get(METADATA_KEY)
            if found:
                return found
    return None
