"""The progress bars' settings: the environment switches and the names both sides agree on."""

from __future__ import annotations

import sys

from helpers.env import project_env, project_env_name, project_flag

PROGRESS_SWITCH_ENV = project_env_name("PROGRESS")  # "off" / "on"; unset: draw in Jupyter or a terminal
PROGRESS_DIR_ENV = project_env_name("PROGRESS_DIR")  # set by the local launcher in each rank: where bars go
RELAY_NAME = "helpers-progress"  # the Ray actor that carries bars from Ray workers to the driver
MIN_INTERVAL = 0.2  # seconds between two states sent for one bar (the first and the last always go)
# in the display's metadata, so tests can find bars in stored notebooks
PROGRESS_METADATA_KEY = "helpers_progress"


def switch() -> bool | None:
    """GALLERY_PROGRESS: True (on), False (off), None (unset: automatic)."""
    return project_flag("PROGRESS")


def progress_dir() -> str | None:
    """GALLERY_PROGRESS_DIR: where rank 0 writes its bars (set by the local launcher), or None."""
    return project_env("PROGRESS_DIR") or None


def in_jupyter_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None
