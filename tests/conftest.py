"""Shared fixtures: run a notebook with papermill into a temporary folder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest

from helpers.execute import execute_notebook, read_metrics

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def notebook_path(stem: str) -> Path:
    path = NOTEBOOKS / f"{stem}.ipynb"
    assert path.exists(), f"no notebook {path}"
    return path


def stream_text(nb: nbformat.NotebookNode, name: str | None = None) -> str:
    """All stream output of the executed notebook (stdout and stderr, or one of them)."""
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream" and (name is None or out.get("name") == name)
    )


def display_text(nb: nbformat.NotebookNode) -> str:
    """The text/plain of every display and result (where record_metrics and the reference check write)."""
    return "\n".join(
        out.get("data", {}).get("text/plain", "")
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.get("output_type") in ("display_data", "execute_result")
    )


@pytest.fixture
def run_notebook(tmp_path):
    """run_notebook('01_ddp_mlp', processes=1) -> (executed notebook, recorded metrics)."""

    def run(stem: str, **parameters: Any) -> tuple[nbformat.NotebookNode, dict[str, Any]]:
        out = tmp_path / f"{stem}-out.ipynb"
        nb = execute_notebook(notebook_path(stem), out, parameters, timeout=900)
        return nb, read_metrics(nb)

    return run


# --- running the suite on several workers (pytest-xdist, `--dist loadgroup`) -----------------------------
# Tests that share something a second process would disturb run on one worker, one after the other:
# everything of one notebook (its nbval cells, which share a kernel, its papermill runs, its default data
# builds and checkpoint folders), everything that starts Ray (one instance at a time on a 2-core machine),
# and everything that uses MosaicML Streaming (its shared memory in /dev/shm is machine-wide, and one test
# cleans up "stale" segments). Tests without a group are spread over the workers one by one.
RAY_FILES = {"test_ray_launcher.py", "test_ray_session.py", "test_launch_core.py", "test_compat.py"}
STREAMING_FILES = {"test_data_movielens.py"}


def xdist_group_for(nodeid: str) -> str | None:
    """The group of a test id, e.g. 'notebooks/06_ray_train_resnet.ipynb::Cell 3' -> 'ray'."""
    path, _, name = nodeid.partition("::")
    file = Path(path).name
    number = re.match(r"(?:test_nb)?(\d\d)_", file) or re.search(r"(?<![\d.])(0\d|1\d)_[a-z]", name)
    notebook = number.group(1) if number else None
    if file in RAY_FILES or notebook == "06":
        return "ray"
    if file in STREAMING_FILES or notebook == "03":
        return "streaming"
    return f"notebook-{notebook}" if notebook else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        group = xdist_group_for(item.nodeid)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
