"""Which metrics moved between two gallery runs (or a run and a baseline), and which way is better.

    python -m helpers.gallery --compare runs/<A> runs/<B>   # which metrics moved; exit 1 on a regression
    python -m helpers.gallery --baseline runs/<A>           # run, then compare with an earlier run

A run is a run folder (its summary.json) or a baseline JSON. `compare` is the library function;
`run_compare` and `add_compare_arguments` are its command-line layer.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.gallery.errors import GalleryError
from helpers.metrics import format_metric

_LOWER = re.compile(r"loss|error|err\b|diff|perplexity|ppl|mse|mae|rmse|nll|wer|cer|distance|_gap", re.I)
_HIGHER = re.compile(r"acc|auc|map\b|\bmap|f1|precision|recall|score|ndcg|hit|iou|r2|bleu|rouge|reward"
                     r"|win_rate", re.I)
_TIMING = re.compile(r"seconds|_secs?\b|_s$|time|latency|throughput|per_s(ec)?\b|_per_|samples_s|tokens_s"
                     r"|it_s", re.I)
_RATE = re.compile(r"throughput|_per_|per_s|samples_s|tokens_s|it_s", re.I)  # timings where higher is better


@dataclass
class Change:
    notebook: str
    metric: str
    before: Any
    after: Any
    verdict: str  # "regression", "improved", "changed", "missing", "added", "fixed"
    note: str = ""

    @property
    def relative(self) -> float | None:
        if isinstance(self.before, (int, float)) and isinstance(self.after, (int, float)) and self.before:
            return (self.after - self.before) / abs(self.before)
        return None


def direction(metric: str, overrides: dict[str, str] | None = None) -> str:
    """'higher', 'lower' (which way is better) or 'either' (unknown: any move counts), from the name."""
    if overrides and metric in overrides:
        return overrides[metric]
    if _LOWER.search(metric) or _TIMING.search(metric):
        return "higher" if _RATE.search(metric) else "lower"
    if _HIGHER.search(metric):
        return "higher"
    return "either"


def load_run(source: str | Path) -> dict[str, dict[str, Any]]:
    """{notebook: {"status", "seconds", "metrics"}} from a run folder, its summary.json, or a baseline
    JSON ({notebook: {metric: value}} or {"notebooks": {notebook: {"metrics": {...}}}})."""
    path = Path(source)
    if path.is_dir():
        path = path / "summary.json"
    if not path.exists():
        raise GalleryError(f"{source}: no such run folder or JSON file (a run folder holds summary.json)")
    data = json.loads(path.read_text())
    notebooks = data.get("notebooks", data) if isinstance(data, dict) else data
    out: dict[str, dict[str, Any]] = {}
    if isinstance(notebooks, list):
        for e in notebooks:
            out[e["notebook"]] = {"status": e.get("status"), "seconds": e.get("seconds"),
                                  "metrics": e.get("metrics") or {}}
    elif isinstance(notebooks, dict):
        for name, e in notebooks.items():
            metrics = e.get("metrics", e) if isinstance(e, dict) else {}
            out[name] = {"status": e.get("status") if "metrics" in e else None, "seconds": e.get("seconds"),
                         "metrics": metrics}
    else:
        raise GalleryError(f"{source}: not a gallery summary or baseline JSON")
    return out


def parse_tolerances(items: list[str]) -> tuple[float, dict[str, float]]:
    """['0.02', 'test_accuracy=0.005', '01_ddp_mlp:loss=0.1'] -> (default, {key: tolerance})."""
    default, per = 0.05, {}
    for item in items:
        key, sep, value = item.rpartition("=")
        try:
            number = float(value)
        except ValueError:
            raise GalleryError(
                f"--tolerance {item!r}: write a relative tolerance (0.05 = 5%) or NAME=0.05") from None
        if sep:
            per[key] = number
        else:
            default = number
    return default, per


def parse_directions(items: list[str]) -> dict[str, str]:
    """['widgets=higher'] -> {'widgets': 'higher'}: which way is better, for names that do not say."""
    directions = {}
    for item in items:
        key, _, value = item.partition("=")
        if value not in ("higher", "lower", "either"):
            raise GalleryError(f"--direction {item!r}: write NAME=higher, NAME=lower or NAME=either")
        directions[key] = value
    return directions


def compare(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], tolerance: float = 0.05,
            tolerances: dict[str, float] | None = None, abs_tolerance: float = 1e-6, timings: bool = False,
            directions: dict[str, str] | None = None) -> tuple[list[Change], int]:
    """Changes beyond tolerance between two runs, and how many metrics stayed within it.

    Floats are measurements: moved when |after - before| > max(tolerance * |before|, abs_tolerance);
    a move the wrong way (by `direction`) is a regression, a move of unknown direction too. Integers,
    strings and booleans (process counts, devices) are configuration: a difference is 'changed', not a
    regression. Timings (seconds, throughput) depend on the machine's load and are skipped unless
    `timings`. A notebook that passed before and fails now is a regression.
    """
    rules = _Rules(tolerance, tolerances or {}, abs_tolerance, timings, directions)
    changes, within = [], 0
    for name in sorted(set(before) | set(after)):
        if name not in after:
            changes.append(Change(name, "(notebook)", "ran", "not run", "missing"))
        elif name not in before:
            changes.append(Change(name, "(notebook)", "not run", after[name].get("status"), "added"))
        else:
            found, same = _compare_notebook(name, before[name], after[name], rules)
            changes += found
            within += same
    return changes, within


@dataclass(frozen=True)
class _Rules:
    """What `compare` was asked: the tolerances, whether timings count, which way is better."""

    tolerance: float
    tolerances: dict[str, float]
    abs_tolerance: float
    timings: bool
    directions: dict[str, str] | None

    def tolerance_for(self, notebook: str, metric: str) -> float:
        return self.tolerances.get(f"{notebook}:{metric}", self.tolerances.get(metric, self.tolerance))


def _status_change(name: str, a: dict[str, Any], b: dict[str, Any]) -> Change | None:
    if a.get("status") == "passed" and b.get("status") not in (None, "passed"):
        return Change(name, "(status)", "passed", b.get("status"), "regression", "the notebook now fails")
    if a.get("status") not in (None, "passed") and b.get("status") == "passed":
        return Change(name, "(status)", a.get("status"), "passed", "fixed")
    return None


def _compare_notebook(name: str, a: dict[str, Any], b: dict[str, Any],
                      rules: _Rules) -> tuple[list[Change], int]:
    """One notebook's changes (its status, then its metrics in the order they were recorded) and how many
    of its metrics stayed within tolerance."""
    status = _status_change(name, a, b)
    changes, within = [status] if status else [], 0
    ma, mb = dict(a.get("metrics") or {}), dict(b.get("metrics") or {})
    if rules.timings and a.get("seconds") is not None and b.get("seconds") is not None:
        ma["wall_seconds"], mb["wall_seconds"] = a["seconds"], b["seconds"]
    for metric in sorted(set(ma) | set(mb), key=lambda k: (list(ma) + list(mb)).index(k)):
        if _TIMING.search(metric) and not rules.timings:
            continue
        if metric not in mb:
            if b.get("status") == "passed" or b.get("status") is None:
                changes.append(Change(name, metric, ma[metric], None, "missing"))
            continue
        if metric not in ma:
            changes.append(Change(name, metric, None, mb[metric], "added"))
            continue
        change = _compare_metric(name, metric, ma[metric], mb[metric], rules)
        if change is None:
            within += 1
        else:
            changes.append(change)
    return changes, within


def _compare_metric(name: str, metric: str, va: Any, vb: Any, rules: _Rules) -> Change | None:
    """The change of one metric present in both runs; None when it stayed within tolerance."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
    if not (numbers and (isinstance(va, float) or isinstance(vb, float))):
        return Change(name, metric, va, vb, "changed", "configuration or count") if va != vb else None
    if not (math.isfinite(va) and math.isfinite(vb)):
        return Change(name, metric, va, vb, "regression", "not finite")
    if abs(vb - va) <= max(rules.tolerance_for(name, metric) * abs(va), rules.abs_tolerance):
        return None
    better = direction(metric, rules.directions)
    if better == "either":
        return Change(name, metric, va, vb, "regression",
                      "moved; direction unknown (say which way is better with --direction)")
    verdict = "improved" if (vb > va) == (better == "higher") else "regression"
    return Change(name, metric, va, vb, verdict, f"{better} is better")


def format_changes(changes: list[Change], within: int, label_a: str, label_b: str, tolerance: float) -> str:
    lines = [f"compare {label_a} -> {label_b} (relative tolerance {tolerance:g})"]
    if changes:
        width = max(len(c.notebook) for c in changes)
        mwidth = max(len(c.metric) for c in changes)
        for c in changes:
            rel = f"{c.relative:+.2%}" if c.relative is not None else ""
            values = f"{format_metric(c.before):>10} -> {format_metric(c.after):<10}"
            note = f" ({c.note})" if c.note else ""
            what = f"{c.notebook:<{width}}  {c.metric:<{mwidth}}"
            lines.append(f"  {what}  {values} {rel:>9}  {c.verdict.upper()}{note}")
    regressions = sum(c.verdict == "regression" for c in changes)
    improved = sum(c.verdict in ("improved", "fixed") for c in changes)
    lines.append(f"{within} metric(s) within tolerance, {improved} improved, {regressions} regression(s), "
                 f"{len(changes) - regressions - improved} other change(s)")
    return "\n".join(lines)


def run_compare(a: str, b: str, tolerance_items: list[str] = (), abs_tolerance: float = 1e-6,
                timings: bool = False, direction_items: list[str] = ()) -> int:
    """Print the comparison; 1 when there is a regression, else 0."""
    tolerance, per = parse_tolerances(list(tolerance_items))
    directions = parse_directions(list(direction_items))
    changes, within = compare(load_run(a), load_run(b), tolerance, per, abs_tolerance, timings, directions)
    print(format_changes(changes, within, str(a), str(b), tolerance))
    return 1 if any(c.verdict == "regression" for c in changes) else 0


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tolerance", action="append", default=[], metavar="[[NB:]METRIC=]REL",
                        help="relative tolerance for --compare/--baseline (default 0.05); repeat per metric")
    parser.add_argument("--abs-tolerance", type=float, default=1e-6,
                        help="changes smaller than this never count (metrics near zero)")
    parser.add_argument("--timings", action="store_true", help="also compare timings (wall time, seconds...)")
    parser.add_argument("--direction", action="append", default=[], metavar="METRIC=higher|lower",
                        help="which way is better, for a metric whose name does not say")
