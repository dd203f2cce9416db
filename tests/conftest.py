"""Shared fixtures: run a notebook with papermill into a temporary folder."""

from __future__ import annotations

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

