"""The notebook's parameters as this run set them: the `parameters` cell, then what papermill injected.

A notebook records its parameters with its metrics (the gallery report's column, MLflow's params). Listing
them again by hand in a later cell drifts from the parameters cell; reading them from the file misses what
papermill injected. The kernel's own input history has both, in the order they ran: the parameters cell is
the first cell of plain literal assignments, and papermill's injected cell (or a re-run of the parameters
cell after an edit) is a later one that assigns only parameter names, with a "# Parameters" comment on top
for papermill's.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

INJECTED_HEADER = "# Parameters"


def literal_assignments(source: str) -> dict[str, Any] | None:
    """{name: value} when every statement of `source` assigns a plain literal to one name, else None."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    values: dict[str, Any] = {}
    for node in body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        else:
            return None
        try:
            values[target] = ast.literal_eval(value)
        except ValueError:
            return None
    return values or None


def parameters_from_history(sources: Iterable[str]) -> dict[str, Any]:
    """The parameters from a kernel's executed cell sources, in execution order (see the module docstring)."""
    values: dict[str, Any] = {}
    for source in sources:
        found = literal_assignments(source)
        if found is None:
            continue
        if not values or source.lstrip().startswith(INJECTED_HEADER) or set(found) <= set(values):
            values.update(found)
    return values


_snapshot: dict[str, Any] | None = None   # the first namespace reading, where the kernel keeps no history


def _is_literal(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_literal(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_literal(v) for k, v in value.items())
    return False


def parameters_from_namespace(namespace: dict[str, Any], hidden: Iterable[str] = ()) -> dict[str, Any]:
    """The parameters from a kernel's namespace, where no input history was kept (nbval executes cells with
    `store_history=False`): the parameters cell is the first cell, so its names are the first the notebook
    defined (a namespace keeps the order names were first set, and papermill's values replace them in place),
    up to the first name of the next cell, an import or a function, which is no plain literal."""
    values: dict[str, Any] = {}
    skip = set(hidden)
    for name, value in namespace.items():
        if name in skip or name.startswith("_"):
            continue
        if not _is_literal(value):
            break
        values[name] = value
    return values


def parameters_as_run() -> dict[str, Any]:
    """This notebook run's parameters, read from the kernel; {} outside an IPython kernel.

    From the kernel's input history where it keeps one (Jupyter, papermill); else from the order of its
    namespace, read once, at the first call (the settings check right after the imports: before any cell could
    change a parameter's value), and that reading returned from then on. Call it in the kernel, after the
    parameters cell ran.
    """
    global _snapshot
    try:
        from IPython import get_ipython
    except ImportError:
        return {}
    shell = get_ipython()
    if shell is None:
        return {}
    found = parameters_from_history(shell.user_ns.get("In", []))
    if found:
        return found
    if _snapshot is None:
        _snapshot = parameters_from_namespace(shell.user_ns, shell.user_ns_hidden)
    return dict(_snapshot)
