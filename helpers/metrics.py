"""Headline metrics a notebook records for the gallery runner (and the reader) to see."""

from __future__ import annotations

import json
import math
from typing import Any

from helpers.display import show_text
from helpers.plain import plain

METRICS_METADATA_KEY = "distributed_gallery"  # where record_metrics's output metadata holds what it recorded


def format_metric(value: Any) -> str:
    """A metric as the report and the comparison show it: floats to 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _metric(name: str, value: Any) -> Any:
    """A metric as it is shown and stored: one number or string, nan as "nan" (the text a table shows)."""
    try:
        return plain(value, nonfinite="str", scalar=True)
    except TypeError as e:
        raise TypeError(f"metric {name}: {e}: record one value per metric") from None


def _host() -> dict[str, Any]:
    """The machine the notebook ran on, for the report's host column and the benchmark page's notebook times
    (torch is only asked if the kernel has imported it; the host name is left out of stored notebooks)."""
    from helpers.host import host_info

    info = host_info(import_torch=False)
    info.pop("hostname")
    return info


def _save_figure(figure: Any, run_dir: str, notebook: str) -> str | None:
    """Save the main figure as PNG into the gallery run folder (the report's thumbnail); its path."""
    import warnings
    from pathlib import Path

    if figure is None or not hasattr(figure, "savefig"):
        return None
    path = Path(run_dir) / "figures" / f"{notebook}.png"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=100, bbox_inches="tight")
        return str(path)
    except Exception as e:
        warnings.warn(f"could not save the figure for the gallery report: {e}", stacklevel=3)
        return None


def record_metrics(*, params: dict[str, Any] | None = None, history: Any = None, figure: Any = None,
                   tracking_uri: str | None = None, mlflow_run_id: str | None = None,
                   logged_model: Any = None, **metrics: Any) -> dict[str, Any]:
    """Show the headline metrics as a table, store them in the cell's output metadata, track the run.

    The run's parameters are read from the kernel (`helpers.parameters.parameters_as_run`: the parameters
    cell and what papermill injected); `params` adds or replaces values, such as a default folder the notebook
    resolved (`output_dir=...`). `logged_model` (what `helpers.registry.log_model` returned) records where the
    trained model was logged: its MLflow run (the one this call completes) and its URI.

    The gallery runner reads the metrics back from the executed notebook, so a notebook needs no side
    channel to report its results, and the stored notebook carries them too. Under the gallery runner
    (`GALLERY_RUN_DIR` set) `figure` is also saved as `figures/<notebook>.png` in the run folder, for the
    report's thumbnail. With tracking on (the default; see `helpers.tracking`), one MLflow run gets
    `params` (the parameters cell's values), `history` (per-epoch/step records: a list of dicts or a
    DataFrame, one MLflow step each), the metrics and `figure` (the notebook's main matplotlib figure);
    `tracking_uri` overrides the store (e.g. an MLflow server; `helpers.tracking.resolve_tracking_uri()`
    gives the store in use, for a notebook whose own logger should write there too); `mlflow_run_id`
    adds to a run the notebook already made (Lightning's MLFlowLogger, Ray's callback) instead of
    starting one. Tracking failures warn once and never stop the notebook. Call it on the driver: inside a
    rank other than 0 nothing is tracked.
    """
    import os

    from helpers import tracking
    from helpers.parameters import parameters_as_run

    params = {**parameters_as_run(), **(params or {})}
    if logged_model is not None:
        mlflow_run_id = mlflow_run_id or logged_model.run_id
        metrics.setdefault("logged_model_uri", logged_model.uri if logged_model.run_id else None)
    recorded = {k: _metric(k, v) for k, v in metrics.items()}
    meta: dict[str, Any] = {"metrics": recorded, "host": _host(),
                            "params": {str(k): plain(v, nonfinite="str", scalar=True, default=str)
                                       for k, v in params.items()}}
    on_driver = os.environ.get("RANK", "0") in ("", "0")
    if on_driver:
        run_dir = os.environ.get(tracking.ENV_RUN_DIR)
        figure_path = _save_figure(figure, run_dir, tracking.notebook_name()) if run_dir else None
        if figure_path:
            meta["figure"] = os.path.relpath(figure_path, run_dir)
        info = tracking.log_notebook_run(metrics=recorded, params=params, history=history, figure=figure,
                                         figure_path=figure_path, tracking_uri=tracking_uri,
                                         continue_run=mlflow_run_id)
        if info:
            meta["tracking"] = info
    text = "\n".join(f"{k:>28}: {v:.6g}" if isinstance(v, float) else f"{k:>28}: {v}"
                     for k, v in recorded.items())
    show_text(text, {METRICS_METADATA_KEY: meta}, printed=json.dumps(recorded))
    return recorded


def driver_peak_rss_mb() -> float:
    """The peak resident memory of this process (the notebook's kernel) so far, in MB.

    What a notebook records to show its driver's memory does not grow with the data (notebook 03's evaluation
    at the ml-25m shape); the ranks are other processes and are not counted.
    """
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux, bytes on macOS
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)
