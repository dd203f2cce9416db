"""Offline data sets, built on the driver in the formats the real data sets use.

Nothing here downloads anything: each builder writes a small, learnable data set in the real format
(COCO, MovieLens, IDX, JSONL...) so that the notebook's real loading code reads it unchanged.
"""

from __future__ import annotations

from helpers.paths import ROOT, cache_dir

__all__ = ["ROOT", "cache_dir"]
