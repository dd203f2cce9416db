"""The repository's own places: its root, the notebooks, the cache of generated data.

One neutral module that every other one may import (data builders, tracking, the gallery runner, the
reference checks, the GPU check), so none of them reaches into another for a path or a notebook's name.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS_DIR = ROOT / "notebooks"


def names_notebook(name: str, stem: str) -> bool:
    """Whether `name` names the notebook `stem`: its stem, or its number ('04' for 04_fsdp_transformer)."""
    return name == stem or stem.split("_", 1)[0] == name


def cache_dir(*parts: str) -> Path:
    """Where generated data goes: data/cache/ in the checkout (git-ignored), or $GALLERY_DATA_CACHE."""
    base = Path(os.environ.get("GALLERY_DATA_CACHE") or ROOT / "data" / "cache")
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
