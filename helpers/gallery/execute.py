"""Execute notebooks with papermill (nbclient for `--store`); notebook_io reads back what they recorded.

Shared by the gallery runner, the tests and `make notebooks`, so that a notebook runs the same way
everywhere: the `python3` kernel of the current environment, the notebook's own folder as the working
directory, and parameters checked against the notebook's `parameters` cell before anything runs.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import nbformat

from helpers.gallery.notebook_io import first_error

KERNEL_NAME = "python3"


def notebook_parameters(path: str | Path) -> dict[str, Any]:
    """The names and default values of the notebook's `parameters` cell (plain literals only)."""
    nb = nbformat.read(str(path), as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and "parameters" in c.metadata.get("tags", [])]
    if not cells:
        raise ValueError(
            f"{path} has no code cell tagged 'parameters': tag one so papermill can inject values.")
    values: dict[str, Any] = {}
    for node in ast.parse(cells[0].source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            values[node.target.id] = ast.literal_eval(node.value)
    return values


def check_parameters(path: str | Path, parameters: dict[str, Any]) -> None:
    """Refuse a parameter the notebook does not declare: papermill would inject it and silently ignore it."""
    declared = notebook_parameters(path)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise ValueError(
            f"{Path(path).name} has no parameter(s) {unknown}; it declares: {sorted(declared)}."
        )


def execute_notebook(src: str | Path, dst: str | Path, parameters: dict[str, Any] | None = None,
                     timeout: int = 900, progress: bool = False, **hooks: Any) -> nbformat.NotebookNode:
    """Run `src` into `dst`. Raises papermill's PapermillExecutionError on a failing cell; `dst` is kept.

    `hooks` go to papermill's engine (e.g. `on_cell_start=...`, as the gallery runner's progress line uses).
    """
    import papermill as pm

    parameters = parameters or {}
    check_parameters(src, parameters)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    return pm.execute_notebook(
        str(src), str(dst), parameters=parameters, kernel_name=KERNEL_NAME,
        cwd=str(Path(src).resolve().parent), progress_bar=progress, execution_timeout=timeout,
        log_output=False, request_save_on_cell_execute=True,
        # ipykernel 7 warns on every start that its loopback TCP sockets are unencrypted: noise here
        extra_arguments=["--IPKernelApp.log_level=ERROR"], **hooks,
    )


def store_outputs(path: str | Path, timeout: int = 1800) -> nbformat.NotebookNode:
    """Re-execute a notebook at its defaults and store the outputs in place (what nbval compares).

    Uses nbclient rather than papermill so the stored file carries no papermill metadata or injected
    cell: it stays the clean source a reader opens. On failure nothing is overwritten.
    """
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(str(path), as_version=4)
    client = NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=timeout,
                            resources={"metadata": {"path": str(path.resolve().parent)}})
    try:
        client.execute()
    except Exception:
        _keep_failed_run(nb, path)
        raise
    errors = first_error(nb)
    if errors:
        kept = _keep_failed_run(nb, path)
        raise RuntimeError(f"{path.name}: cell {errors['cell']} raised {errors['ename']}: {errors['evalue']} "
                           f"(the executed copy: {kept})")
    nbformat.write(nb, str(path))
    return nb


def _keep_failed_run(nb: nbformat.NotebookNode, path: Path) -> Path:
    """The failed execution, kept beside the run folders: its outputs say why (a reference table, a
    traceback), and the stored notebook stays as it was."""
    from helpers.paths import ROOT

    kept = ROOT / "runs" / "store-failures" / path.name
    kept.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(kept))
    return kept
