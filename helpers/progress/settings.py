"""The progress bars' settings: the environment switches and the names both sides agree on."""

from __future__ import annotations

import sys

from helpers.env import env_flag

PROGRESS_SWITCH_ENV = "HELPERS_PROGRESS"  # "off" / "on"; unset: draw in a Jupyter kernel or a terminal
PROGRESS_DIR_ENV = "HELPERS_PROGRESS_DIR"  # set by the local launcher in each worker: where rank 0's bars go
RELAY_NAME = "helpers-progress"  # the Ray actor that carries bars from Ray workers to the driver
MIN_INTERVAL = 0.2  # seconds between two states sent for one bar (the first and the last always go)
# in the display's metadata, so tests can find bars in stored notebooks
PROGRESS_METADATA_KEY = "helpers_progress"


def switch() -> bool | None:
    """HELPERS_PROGRESS: True (on), False (off), None (unset: automatic)."""
    return env_flag(PROGRESS_SWITCH_ENV)


def in_jupyter_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None
