"""distributed-gallery helpers: the notebook launcher, offline data sets, and the gallery runner.

The public names load on first use (PEP 562), so `import helpers` imports neither torch nor the launcher and
changes nothing: `python -m helpers.gallery --list` or a report stays quick. Importing the launcher
(`helpers.launch`, or any of its names here) prepares the process for launching; see its docstring.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_PUBLIC = {
    "DistributedFunction": "helpers.launch",
    "LaunchError": "helpers.launch",
    "LaunchOptions": "helpers.launch",
    "LaunchPlan": "helpers.launch",
    "RankError": "helpers.launch",
    "RankFailedError": "helpers.launch",
    "distributed": "helpers.launch",
    "plan_launch": "helpers.launch",
    "preload": "helpers.launch",
    "ray_session": "helpers.launch",
    "WorkerContext": "helpers.context",
    "worker_context": "helpers.context",
    "record_metrics": "helpers.metrics",
    "progress_bar": "helpers.progress",
    "check_against_reference": "helpers.reference",
}

__all__ = [
    "DistributedFunction", "LaunchError", "LaunchOptions", "LaunchPlan", "RankError", "RankFailedError",
    "WorkerContext", "check_against_reference", "distributed", "plan_launch", "preload", "progress_bar",
    "ray_session", "record_metrics", "worker_context",
]

if TYPE_CHECKING:
    from helpers.context import WorkerContext, worker_context
    from helpers.launch import (
        DistributedFunction,
        LaunchError,
        LaunchOptions,
        LaunchPlan,
        RankError,
        RankFailedError,
        distributed,
        plan_launch,
        preload,
        ray_session,
    )
    from helpers.metrics import record_metrics
    from helpers.progress import progress_bar
    from helpers.reference import check_against_reference


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:  # a submodule (`from helpers import tracking`) is imported by Python itself after this
        raise AttributeError(f"module 'helpers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
