"""Experiment tracking with MLflow: one MLflow run per notebook run, logged by `record_metrics`.

`helpers.record_metrics(...)` (the last cell of every notebook, on the driver) calls `log_notebook_run`,
which logs the notebook's parameters, its per-epoch history (one MLflow step per record), its final
metrics and its main figure. Where the run goes, first that applies:

1. `record_metrics(..., tracking_uri="http://mlflow.example:5000")`;
2. `GALLERY_TRACKING_URI` (the gallery runner sets it to the run folder's store; set it yourself for a
   server), then MLflow's own `MLFLOW_TRACKING_URI`;
3. `sqlite:///data/cache/mlruns/mlflow.db` in the checkout (interactive use, nbval, tests).

`GALLERY_TRACKING=off` turns tracking off. Tracking never stops a notebook: if MLflow is missing,
unreachable or broken, a `TrackingWarning` says so once per store and the notebook carries on. HTTP
stores get short timeouts by default (`MLFLOW_HTTP_REQUEST_MAX_RETRIES=1`, `..._TIMEOUT=5`; your own
values win) so an unreachable server costs seconds, not minutes.

The MLflow client API is used rather than `mlflow.start_run()`, so the user's own fluent MLflow state
(active run, tracking URI) in the kernel is left alone.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.env import env_flag
from helpers.files import temporary_sibling
from helpers.logs import quieted
from helpers.plain import plain

ENV_URI = "GALLERY_TRACKING_URI"
ENV_SWITCH = "GALLERY_TRACKING"
ENV_RUN_ID = "GALLERY_RUN_ID"
ENV_RUN_DIR = "GALLERY_RUN_DIR"
ENV_NOTEBOOK = "GALLERY_NOTEBOOK"
DB_NAME = "mlflow.db"
ARTIFACTS_NAME = "mlartifacts"
STEP_KEYS = ("step", "epoch", "global_step", "iteration")
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
_failed_uris: set[str] = set()  # stores that failed once in this process: warned about, not retried


class TrackingWarning(UserWarning):
    """MLflow tracking did not work; the notebook carries on without it."""


def enabled() -> bool:
    return bool(env_flag(ENV_SWITCH, default=True))


def default_tracking_uri() -> str:
    """The store for runs outside the gallery runner: data/cache/mlruns/mlflow.db (git-ignored)."""
    from helpers.paths import cache_dir

    return sqlite_uri(cache_dir("mlruns") / DB_NAME)


def sqlite_uri(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def resolve_tracking_uri(explicit: str | None = None) -> str:
    return (explicit or os.environ.get(ENV_URI) or os.environ.get("MLFLOW_TRACKING_URI")
            or default_tracking_uri())


def check_register_as(register_as: str | None) -> None:
    """Before any training: a registry name that MLflow will refuse, or one given with tracking off, fails
    now with the fix, not after the run when the model is logged."""
    if register_as is None:
        return
    if not isinstance(register_as, str) or not register_as.strip() or any(c in register_as for c in "/:%"):
        raise ValueError(f"register_as={register_as!r}: give the name to register the model under, such as "
                         "'digits-mlp' (no '/', ':' or '%'), or None to log it without registering it.")
    if not enabled():
        raise ValueError(f"register_as={register_as!r} registers the trained model in MLflow, but tracking "
                         f"is off ({ENV_SWITCH}=off): unset {ENV_SWITCH}, or set register_as=None.")


def logged_model_uri(model_info: Any, register_as: str | None) -> str:
    """Where to load a model logged with `registered_model_name=register_as` from: the registry's
    `models:/<name>/<version>` when it was registered, else the run's own copy."""
    version = getattr(model_info, "registered_model_version", None)
    if register_as and version is not None:
        return f"models:/{register_as}/{version}"
    return model_info.model_uri


def notebook_name() -> str:
    """The running notebook's stem: set by the gallery runner, else by Jupyter (JPY_SESSION_NAME)."""
    name = os.environ.get(ENV_NOTEBOOK) or os.environ.get("JPY_SESSION_NAME") or ""
    return Path(name).stem or "notebook"


def _sqlite_path(uri: str) -> Path | None:
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep MLflow's and alembic's INFO lines and warnings out of the notebook's output."""
    with quieted(("mlflow", "alembic", "sqlalchemy", "urllib3")), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _import_mlflow():
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # nothing leaves the machine
    with _quiet():
        import mlflow
        from mlflow import MlflowClient
    return mlflow, MlflowClient


def _ensure_sqlite_store(db: Path) -> None:
    """Create a new SQLite store by copying an empty template: MLflow's own schema migrations take
    5-10 s on a small machine, and every gallery run starts a new store. The template (one per MLflow
    version) is built once in data/cache/mlruns/."""
    if db.exists():
        return
    mlflow, MlflowClient = _import_mlflow()
    from helpers.paths import cache_dir

    template = cache_dir("mlruns") / f"empty-mlflow-{mlflow.__version__}.db"
    if not template.exists():
        tmp_dir = Path(tempfile.mkdtemp(dir=template.parent, prefix=".template-"))
        try:
            with _quiet():
                MlflowClient(sqlite_uri(tmp_dir / DB_NAME)).search_experiments(max_results=1)
            os.replace(tmp_dir / DB_NAME, template)
        finally:
            shutil.rmtree(tmp_dir, ignore_errors=True)
    db.parent.mkdir(parents=True, exist_ok=True)
    partial = temporary_sibling(db)
    try:
        shutil.copyfile(template, partial)
        # a link, not helpers.files.atomic_write's replace: a store another process made meanwhile is kept
        with contextlib.suppress(FileExistsError):
            os.link(partial, db)
    finally:
        partial.unlink(missing_ok=True)


def client_for(uri: str):
    """An MlflowClient for `uri`, creating a new SQLite store quickly (see `_ensure_sqlite_store`)."""
    if uri.startswith(("http://", "https://")):
        for key, value in _HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
    db = _sqlite_path(uri)
    if db is not None:
        _ensure_sqlite_store(db)
    _, MlflowClient = _import_mlflow()
    with _quiet():
        return MlflowClient(tracking_uri=uri)


def _experiment_id(client, name: str, uri: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    db = _sqlite_path(uri)
    # A SQLite store's default artifact root is ./mlruns relative to the *current directory* (the
    # notebook's folder): put the artifacts next to the database instead.
    location = (db.parent / ARTIFACTS_NAME).resolve().as_uri() if db is not None else None
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # created meanwhile by another process
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def create_experiment(name: str, uri: str | None = None) -> str:
    """The id of experiment `name` in the store at `uri` (resolved as everywhere here), created if missing.

    For a notebook whose own logger (Lightning's MLFlowLogger, mlflow.start_run) writes the run that
    `record_metrics(..., mlflow_run_id=...)` then completes: created here, once, on the driver, so ranks do
    not race to create the store, and with a SQLite store's artifacts next to its database.
    """
    uri = resolve_tracking_uri(uri)
    return _experiment_id(client_for(uri), name, uri)


def _number(value: Any) -> float | None:
    """A value MLflow logs as a metric: a finite number (a bool as 0 or 1); None for anything else."""
    with contextlib.suppress(Exception):  # a value that cannot be converted is not a number
        value = plain(value, scalar=True, default=lambda _: None)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def history_records(history: Any) -> list[dict[str, Any]]:
    """A list of dicts from a list of dicts or a DataFrame (a named index such as 'epoch' is kept)."""
    if history is None:
        return []
    if hasattr(history, "to_dict") and hasattr(history, "columns"):
        frame = history.reset_index() if history.index.name is not None else history
        return frame.to_dict("records")
    return [dict(r) for r in history]


def history_metrics(history: Any) -> list[tuple[str, float, int]]:
    """(key, value, step) for every finite numeric value; the step is the record's step/epoch, else
    its position."""
    out = []
    for position, record in enumerate(history_records(history)):
        step_key = next((k for k in STEP_KEYS if _number(record.get(k)) is not None), None)
        step = int(_number(record[step_key])) if step_key else position
        for key, value in record.items():
            number = _number(value)
            if key != step_key and number is not None:
                out.append((str(key), number, step))
    return out


def _key(name: Any) -> str:
    """A name MLflow accepts (letters, digits, _ - . space / :), other characters replaced by '_'."""
    return re.sub(r"[^\w\-. /:]", "_", str(name))[:250] or "_"


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def warn_once(uri: str, error: BaseException) -> None:
    if uri in _failed_uris:
        return
    _failed_uris.add(uri)
    warnings.warn(
        f"MLflow tracking to {uri} failed ({type(error).__name__}: {str(error)[:300]}); the notebook carries "
        f"on without it. Fix or unset {ENV_URI} / MLFLOW_TRACKING_URI, or set {ENV_SWITCH}=off.",
        TrackingWarning, stacklevel=3,
    )


def log_notebook_run(*, metrics: dict[str, Any], params: dict[str, Any] | None = None, history: Any = None,
                     figure: Any = None, figure_path: str | Path | None = None,
                     tracking_uri: str | None = None, notebook: str | None = None,
                     status: str = "FINISHED", tags: dict[str, str] | None = None,
                     artifacts: list[str | Path] = (),
                     continue_run: str | None = None) -> dict[str, str] | None:
    """Log one notebook run to MLflow; return {"run_id", "experiment_id"}, or None (off, or failed).

    `continue_run`: the id of an MLflow run the notebook already made (e.g. with Lightning's MLFlowLogger
    on rank 0) to add to, instead of a new one, so that a notebook run stays one MLflow run. Its params
    and per-step metrics are kept; the gallery tags, final metrics, missing params and figure are added.

    Never raises: a failure warns once per store (`TrackingWarning`) and returns None.
    """
    if not enabled():
        return None
    uri = resolve_tracking_uri(tracking_uri)
    if uri in _failed_uris:
        return None
    notebook = notebook or notebook_name()
    content = _RunContent(metrics, params or {}, history, figure, figure_path, tuple(artifacts))
    try:
        client = client_for(uri)
        with _quiet():
            if continue_run:
                info, figure_error = _add_to_run(client, continue_run, _run_tags(notebook, tags), content)
            else:
                info, figure_error = _log_new_run(client, uri, notebook, _run_tags(notebook, tags), content,
                                                  status)
    except Exception as e:
        warn_once(uri, e)
        return None
    if figure_error is not None:  # (outside _quiet, which silences warnings)
        warnings.warn(f"MLflow could not store the figure ({type(figure_error).__name__}: "
                      f"{figure_error})", TrackingWarning, stacklevel=3)
    return info


@dataclass(frozen=True)
class _RunContent:
    """What a notebook run logs, to a new run or to the notebook's own."""

    metrics: dict[str, Any]
    params: dict[str, Any]
    history: Any
    figure: Any
    figure_path: str | Path | None
    artifacts: tuple[str | Path, ...]


_SOURCE_TAGS = ("mlflow.source.name", "mlflow.source.type")  # set when a run is created, not after


def _run_tags(notebook: str, tags: dict[str, str] | None) -> dict[str, str]:
    run_tags = {"gallery.notebook": notebook, "gallery.host": platform.node(),
                _SOURCE_TAGS[0]: f"notebooks/{notebook}.ipynb", _SOURCE_TAGS[1]: "NOTEBOOK"}
    if os.environ.get(ENV_RUN_ID):
        run_tags["gallery.run_id"] = os.environ[ENV_RUN_ID]
    run_tags.update(tags or {})
    return run_tags


def _log_new_run(client, uri: str, notebook: str, run_tags: dict[str, str], content: _RunContent,
                 status: str) -> tuple[dict[str, str], Exception | None]:
    """A new run in the notebook's experiment, ended with `status` (FAILED when logging it failed)."""
    experiment_id = _experiment_id(client, notebook, uri)
    run_name = f"{notebook} {os.environ.get(ENV_RUN_ID) or time.strftime('%Y%m%d-%H%M%S')}"
    run_id = client.create_run(experiment_id, run_name=run_name, tags=run_tags).info.run_id
    try:
        figure_error = _log_content(client, run_id, content)
        client.set_terminated(run_id, status=status)
    except Exception:
        with contextlib.suppress(Exception):
            client.set_terminated(run_id, status="FAILED")
        raise
    return {"run_id": run_id, "experiment_id": experiment_id}, figure_error


def _add_to_run(client, run_id: str, run_tags: dict[str, str],
                content: _RunContent) -> tuple[dict[str, str], Exception | None]:
    """Add to the notebook's own run (Lightning's or Ray's logger), which that logger ends: what it logged
    stays, params and per-step metrics included."""
    from mlflow.entities import RunTag

    run = client.get_run(run_id)
    client.log_batch(run_id, tags=[RunTag(k, v) for k, v in run_tags.items() if k not in _SOURCE_TAGS])
    figure_error = _log_content(client, run_id, content, set(run.data.params), set(run.data.metrics))
    return {"run_id": run.info.run_id, "experiment_id": run.info.experiment_id}, figure_error


def _log_content(client, run_id: str, content: _RunContent, existing_params: set[str] = frozenset(),
                 existing_metrics: set[str] = frozenset()) -> Exception | None:
    """Log the history, the final metrics (at the history's last step; text ones as tags), the params the
    run lacks (MLflow params are immutable), the figure and the artifacts; the error of a figure MLflow
    could not store (it must not lose the run)."""
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000)
    logged = [Metric(_key(k), v, now, s) for k, v, s in history_metrics(content.history)
              if _key(k) not in existing_metrics]
    last_step = max((m.step for m in logged), default=0)
    text = []
    for key, value in content.metrics.items():
        number = _number(value)
        if number is None:
            text.append(RunTag(f"metric.{_key(key)}", str(value)[:5000]))
        else:
            logged.append(Metric(_key(key), number, now, last_step))
    params = [Param(_key(k), str(v)[:6000]) for k, v in content.params.items()
              if _key(k) not in existing_params]
    for batch in _chunks(logged, 1000):
        client.log_batch(run_id, metrics=batch)
    for batch in _chunks(params, 100):
        client.log_batch(run_id, params=batch)
    if text:
        client.log_batch(run_id, tags=text)
    figure_error = None
    try:
        if content.figure_path is not None and Path(content.figure_path).exists():
            client.log_artifact(run_id, str(content.figure_path))
        elif content.figure is not None:
            client.log_figure(run_id, content.figure, "figure.png")
    except Exception as e:
        figure_error = e
    for path in content.artifacts:
        client.log_artifact(run_id, str(path))
    return figure_error


def attach_artifacts(run_id: str, paths: list[str | Path], tracking_uri: str | None = None) -> bool:
    """Add files (the executed notebook, its HTML) to an existing run; False (warned once) on failure."""
    if not enabled():
        return False
    uri = resolve_tracking_uri(tracking_uri)
    if uri in _failed_uris:
        return False
    try:
        client = client_for(uri)
        with _quiet():
            for path in paths:
                client.log_artifact(run_id, str(path))
        return True
    except Exception as e:
        warn_once(uri, e)
        return False
