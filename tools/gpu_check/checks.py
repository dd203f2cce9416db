"""Each notebook's check, read from its record in helpers/gallery/catalog.py: the few-step parameters, the
time limit, the metric that holds its throughput, what the bundle carries and what it cannot."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from helpers.gallery.catalog import CATALOG
from helpers.paths import NOTEBOOKS_DIR, names_notebook


@dataclass(frozen=True)
class NotebookCheck:
    """How one notebook is checked: its few-step parameters, its time limit, what it records."""

    name: str
    limit_s: int  # wall clock for the whole notebook on one H200 (scaled by --time-scale)
    throughput: str  # the metric that holds its throughput
    parameters: dict[str, Any] = field(default_factory=dict)  # papermill parameters (processes is added)
    cpu_parameters: dict[str, Any] = field(default_factory=dict)  # overrides for --device cpu
    carried: tuple[str, ...] = ()  # modules the bundle brings: missing means the bundle is, a failure
    uncarried: tuple[str, ...] = ()  # modules that cannot be carried: missing means skipped
    uncarried_reason: str = ""
    note_one_process: str = ""  # what runs elsewhere (or not at all) when the notebook gets one GPU
    source: Path | None = None  # the notebook file (default: notebooks/<name>.ipynb)

    @property
    def path(self) -> Path:
        return self.source or NOTEBOOKS_DIR / f"{self.name}.ipynb"


# Each notebook's check is in its record of helpers/gallery/catalog.py (with why its limit is what it is).
CHECKS: tuple[NotebookCheck, ...] = tuple(
    NotebookCheck(nb.stem, **{f.name: getattr(nb.gpu_check, f.name) for f in fields(nb.gpu_check)})
    for nb in CATALOG if nb.gpu_check)


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def runnable(check: NotebookCheck) -> bool:
    """False when the notebook needs what cannot be carried and this Python lacks it (it will be skipped)."""
    return all(importable(m) for m in check.uncarried)


def select(checks: tuple[NotebookCheck, ...], only: list[str]) -> list[NotebookCheck]:
    """The checks `--only` names (by number or name), in their order; all of them when it names none."""
    if not only:
        return list(checks)
    chosen = [c for c in checks if any(names_notebook(o, c.name) for o in only)]
    unknown = [o for o in only if not any(names_notebook(o, c.name) for c in checks)]
    if unknown:
        raise SystemExit(f"gpu_check: no notebook {unknown}; choose from {[c.name for c in checks]}")
    return chosen
