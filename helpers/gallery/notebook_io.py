"""Reading executed notebooks: what the cells recorded, the first error, the last figure.

One meaning of "cell N" for every tool (the runner's report, `make notebooks`, the GPU check, the reference
benchmark): the cell's position in the source notebook, counted from 0, so the number a report gives is the
cell a reader finds in the notebook they opened. The cells papermill adds to an executed copy (its injected
parameters and its error banner) are not counted; an error in the injected parameters says so instead.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat

from helpers.metrics import METRICS_METADATA_KEY
from helpers.reference import REFERENCE_METADATA_KEY

PAPERMILL_ERROR_TAG = "papermill-error-cell-tag"
INJECTED_TAG = "injected-parameters"
NotebookLike = nbformat.NotebookNode | str | Path


def read(nb: NotebookLike) -> nbformat.NotebookNode:
    return nb if isinstance(nb, nbformat.NotebookNode) else nbformat.read(str(nb), as_version=4)


def numbered_cells(nb: NotebookLike) -> Iterator[tuple[int | str, nbformat.NotebookNode]]:
    """(number, cell) in order: the source's numbering, "injected parameters" for papermill's cell."""
    index = 0
    for cell in read(nb).cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if PAPERMILL_ERROR_TAG in tags:
            continue
        if INJECTED_TAG in tags:
            yield "injected parameters", cell
            continue
        yield index, cell
        index += 1


def outputs(nb: NotebookLike) -> Iterator[tuple[int | str, nbformat.NotebookNode, dict[str, Any]]]:
    """(cell number, cell, output) for every output, in order."""
    for number, cell in numbered_cells(nb):
        for out in cell.get("outputs", []):
            yield number, cell, out


def record_metadata(nb: NotebookLike) -> dict[str, Any]:
    """Everything `record_metrics` stored in the executed notebook (metrics, params, host, figure,
    tracking); a later record's values win, nested dictionaries merged."""
    meta: dict[str, Any] = {}
    for _, _, out in outputs(nb):
        found = out.get("metadata", {}).get(METRICS_METADATA_KEY)
        for key, value in (found or {}).items():
            if isinstance(value, dict):
                meta.setdefault(key, {}).update(value)
            else:
                meta[key] = value
    return meta


def read_metrics(nb: NotebookLike) -> dict[str, Any]:
    """Every metric the notebook recorded with `helpers.record_metrics`, later values winning."""
    return record_metadata(nb).get("metrics", {})


def reference_values(nb: NotebookLike) -> dict[str, Any] | None:
    """What `check_against_reference` measured in an executed notebook (None if it did not run)."""
    for _, _, out in outputs(nb):
        found = out.get("metadata", {}).get(REFERENCE_METADATA_KEY)
        if found:
            return found
    return None


def first_error(nb: NotebookLike) -> dict[str, Any] | None:
    """The first cell that raised: its number, its id in this file (for an HTML anchor), the exception's
    name and value, and the cell's first line of code."""
    for number, cell, out in outputs(nb):
        if out.get("output_type") == "error":
            code = next((line for line in cell.source.splitlines()
                         if line.strip() and not line.lstrip().startswith("#")), "")
            return {"cell": number, "cell_id": cell.get("id"), "execution_count": cell.get("execution_count"),
                    "ename": out.get("ename"), "evalue": out.get("evalue"), "code": code.strip()[:120]}
    return None


def last_png(nb: NotebookLike) -> bytes | None:
    """The notebook's last image/png output, decoded."""
    last = None
    for _, _, out in outputs(nb):
        data = out.get("data", {}).get("image/png")
        if data:
            last = data
    if last is None:
        return None
    return base64.b64decode(last if isinstance(last, str) else "".join(last))
