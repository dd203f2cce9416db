"""Offline data sets, built on the driver in the formats the real data sets use.

Nothing here downloads anything: each builder writes a small, learnable data set in the real format
(COCO, MovieLens, IDX, JSONL...) so that the notebook's real loading code reads it unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cache_dir(*parts: str) -> Path:
    """Where generated data goes: data/cache/ in the checkout (git-ignored), or $GALLERY_DATA_CACHE."""
    base = Path(os.environ.get("GALLERY_DATA_CACHE") or ROOT / "data" / "cache")
    path = base.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
