"""distributed-gallery helpers: the notebook launcher, offline data sets, and the gallery runner.

The public names load on first use (PEP 562), so `import helpers` imports neither torch nor the launcher and
changes nothing: `python -m helpers.gallery --list` or a report stays quick. Importing the launcher
(`helpers.launch`, or any of its names here) prepares the process for launching; see its docstring.
"""

from __future__ import annotations

import importlib
from typing import Any

# The public names, each with the module it loads from: the one listing (`__all__` and the lookup follow it).
_PUBLIC_BY_MODULE = {
    "helpers.launch": ("DistributedFunction", "LaunchError", "LaunchOptions", "LaunchPlan", "RankError",
                       "RankFailedError", "distributed", "plan_launch", "preload", "ray_session"),
    "helpers.context": ("WorkerContext", "worker_context"),
    "helpers.metrics": ("record_metrics",),
    "helpers.progress": ("progress_bar",),
    "helpers.reference": ("check_against_reference",),
}
_PUBLIC = {name: module for module, names in _PUBLIC_BY_MODULE.items() for name in names}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:  # a submodule (`from helpers import tracking`) is imported by Python itself after this
        raise AttributeError(f"module 'helpers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
