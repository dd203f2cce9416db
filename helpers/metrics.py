"""Headline metrics a notebook records for the gallery runner (and the reader) to see."""

from __future__ import annotations

import json
import math
from typing import Any

METADATA_KEY = "distributed_gallery"


def _plain(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise TypeError(f"metric value {value!r} ({type(value).__name__}) is not a number or string")


def record_metrics(*, params: dict[str, Any] | None = None, history: Any = None, figure: Any = None,
                   **metrics: Any) -> dict[str, Any]:
    """Show the headline metrics as a table and store them in the cell's output metadata.

    The gallery runner reads them back from the executed notebook, so a notebook needs no side channel
    (files, environment variables) to report its results, and the stored notebook carries them too.
    `params` (the parameters cell's values), `history` (per-epoch/step records: a list of dicts or a
    DataFrame) and `figure` (the notebook's main matplotlib figure) go to experiment tracking.
    Call it on the driver (never inside a rank).
    """
    plain = {k: _plain(v) for k, v in metrics.items()}
    text = "\n".join(f"{k:>28}: {v:.6g}" if isinstance(v, float) else f"{k:>28}: {v}" for k, v in plain.items())
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display({"text/plain": text}, raw=True, metadata={METADATA_KEY: {"metrics": plain}})
            return plain
    except ImportError:
        pass
    print(json.dumps(plain))
    return plain
