"""Run the whole gallery (or some notebooks) as one job: executed notebooks, an HTML report, tracking.

A parameter given as NAME=VALUE goes to every selected notebook that declares NAME; NOTEBOOK:NAME=VALUE
to that notebook only (an error if it does not declare it), and wins over NAME=VALUE. Values are Python
literals, else strings. Everything is checked before the first notebook starts. A failing notebook does
not stop the others.

Output: runs/<stamp>/ with notebooks/<nb>.ipynb (executed) and .html (rendered), figures/<nb>.png (main
figures), index.html (the report: open it in a browser), summary.json, summary.md, and the MLflow store
mlflow.db + mlartifacts/ (`mlflow ui --backend-store-uri sqlite:///runs/<stamp>/mlflow.db`). The report
and summary are rewritten after every notebook, so a long run can be watched.

The kernel of each notebook gets GALLERY_RUN_ID, GALLERY_RUN_DIR, GALLERY_NOTEBOOK and
GALLERY_TRACKING_URI (or GALLERY_TRACKING=off), read by `helpers.record_metrics`.
"""

from __future__ import annotations

import ast
import datetime as dt
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from helpers import tracking
from helpers.env import temporary_environ
from helpers.files import atomic_write, write_json
from helpers.gallery.errors import GalleryError
from helpers.gallery.execute import execute_notebook, notebook_parameters
from helpers.gallery.notebook_io import first_error, record_metadata
from helpers.gallery.report import complete_entry, write_index
from helpers.metrics import format_metric
from helpers.paths import NOTEBOOKS_DIR, names_notebook


@dataclass
class NotebookResult:
    notebook: str
    status: str  # "passed", "failed" or "pending" (not run yet)
    seconds: float | None
    parameters: dict[str, Any]  # given on the command line
    metrics: dict[str, Any] = field(default_factory=dict)
    output: str = ""  # the executed notebook, relative to the run folder
    error: dict[str, Any] | None = None  # cell, ename, evalue, anchor (in the HTML)
    all_parameters: dict[str, Any] = field(default_factory=dict)  # defaults + given
    html: str | None = None
    figure: str | None = None
    host: dict[str, Any] = field(default_factory=dict)  # what the notebook's driver saw
    tracking: dict[str, Any] | None = None  # MLflow run_id, experiment_id


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def discover(names: list[str], notebooks_dir: Path = NOTEBOOKS_DIR) -> list[Path]:
    """Notebooks by full name, stem, or leading number ('01'); all of them when none is named."""
    available = sorted(notebooks_dir.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return available
    chosen = []
    for name in names:
        stem = Path(name).stem
        matches = [p for p in available if names_notebook(stem, p.stem)]
        if Path(name).suffix == ".ipynb" and Path(name).exists():
            matches = [Path(name).resolve()]
        if len(matches) != 1:
            raise GalleryError(
                f"no single notebook matches {name!r}; available: {', '.join(p.stem for p in available)}"
            )
        chosen.append(matches[0])
    return chosen


def parse_overrides(items: list[str], notebooks: list[Path]) -> dict[Path, dict[str, Any]]:
    """Resolve -p options into per-notebook parameters, refusing names no notebook declares."""
    declared = {nb: notebook_parameters(nb) for nb in notebooks}
    per_nb: dict[Path, dict[str, Any]] = {nb: {} for nb in notebooks}
    for item in items:
        if "=" not in item:
            raise GalleryError(f"-p {item!r}: write NAME=VALUE or NOTEBOOK:NAME=VALUE")
        key, value = item.split("=", 1)
        target, _, name = key.rpartition(":")
        value = _literal(value)
        if target:
            nb = discover([target], notebooks[0].parent if notebooks else NOTEBOOKS_DIR)[0]
            if nb not in per_nb:
                raise GalleryError(f"-p {item!r}: {nb.stem} is not among the notebooks selected to run")
            if name not in declared[nb]:
                raise GalleryError(
                    f"-p {item!r}: {nb.stem} has no parameter {name!r}; it has {sorted(declared[nb])}")
            per_nb[nb][name] = value
        else:
            takers = [nb for nb in notebooks if name in declared[nb]]
            if not takers:
                raise GalleryError(f"-p {item!r}: no selected notebook declares a parameter {name!r}")
            for nb in takers:
                per_nb[nb].setdefault(name, value)
    # Notebook-specific values win over global ones whatever their order on the command line.
    for item in items:
        key, value = item.split("=", 1)
        target, _, name = key.rpartition(":")
        if target:
            per_nb[discover([target], notebooks[0].parent)[0]][name] = _literal(value)
    return per_nb


class CellProgress:
    """Shows which notebook and which cell is running: one updating line on a terminal, a line per code
    cell in a log. Used as nbclient's on_notebook_start / on_cell_start hooks (through papermill)."""

    def __init__(self, label: str, stream: Any = None, tty: bool | None = None):
        self.label = label
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty() if tty is None else tty
        self.total = 0
        self.start = time.perf_counter()

    def notebook_start(self, notebook: Any = None, **_: Any) -> None:
        self.total = len(notebook.cells) if notebook is not None else 0

    def cell_start(self, cell: Any = None, cell_index: int = 0, **_: Any) -> None:
        if cell is None or cell.cell_type != "code" or not cell.source.strip():
            return
        first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
        first = first if len(first) <= 60 else first[:57] + "..."
        text = (f"    {self.label} cell {cell_index + 1}/{self.total or '?'} "
                f"[{time.perf_counter() - self.start:5.0f} s] {first}")
        if self.tty:
            self.stream.write("\r\033[K" + text[: max(20, _columns() - 1)])
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _columns() -> int:
    import shutil

    return shutil.get_terminal_size((100, 20)).columns


def execute_with_progress(src: Path, dst: Path, parameters: dict[str, Any], timeout: int,
                          progress: CellProgress | None) -> None:
    """execute.execute_notebook's papermill call (same kernel, cwd and checks) plus per-cell hooks.
    Raises papermill's PapermillExecutionError on a failing cell; `dst` is kept."""
    hooks = {}
    if progress:
        hooks = {"on_notebook_start": progress.notebook_start, "on_cell_start": progress.cell_start}
    try:
        execute_notebook(src, dst, parameters, timeout=timeout, **hooks)
    finally:
        if progress:
            progress.close()


def _track_after(result: NotebookResult, run_dir: Path, tracking_uri: str | None) -> None:
    """Attach the executed notebook and its HTML to the notebook's MLflow run; a notebook that never
    reached record_metrics (it failed) still gets a run, marked FAILED, with its parameters and error."""
    if tracking_uri is None:
        return
    files = [run_dir / p for p in (result.output, result.html) if p and (run_dir / p).exists()]
    if result.tracking and result.tracking.get("run_id"):
        tracking.attach_artifacts(result.tracking["run_id"], files, tracking_uri)
        return
    tags = {}
    if result.error:
        tags["gallery.error"] = f"{result.error.get('ename')}: {result.error.get('evalue')}"[:5000]
    figure = run_dir / result.figure if result.figure else None
    result.tracking = tracking.log_notebook_run(
        metrics=result.metrics, params=result.all_parameters, tracking_uri=tracking_uri,
        notebook=result.notebook, status="FINISHED" if result.status == "passed" else "FAILED", tags=tags,
        artifacts=files, figure_path=figure)


def run_gallery(notebooks: list[Path], overrides: dict[Path, dict[str, Any]], run_dir: Path,
                timeout: int, progress: bool = True, tracking_uri: str | None = None, report: bool = True,
                host: dict[str, Any] | None = None) -> list[NotebookResult]:
    """Execute the notebooks one after the other into `run_dir`; rewrite summary and report after each.

    `tracking_uri` None turns MLflow tracking off (the kernels get GALLERY_TRACKING=off)."""
    host = host or {}
    out_dir = run_dir / "notebooks"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = [NotebookResult(nb.stem, "pending", None, overrides.get(nb, {}),
                              all_parameters={**notebook_parameters(nb), **overrides.get(nb, {})})
               for nb in notebooks]
    started = dt.datetime.now().isoformat(timespec="seconds")
    run_env = {tracking.ENV_RUN_ID: run_dir.name, tracking.ENV_RUN_DIR: str(run_dir.resolve()),
               tracking.ENV_URI: tracking_uri, tracking.ENV_SWITCH: "on" if tracking_uri else "off"}
    with temporary_environ(run_env):
        for i, (nb, result) in enumerate(zip(notebooks, results, strict=True), 1):
            params = result.parameters
            shown = " ".join(f"{k}={v!r}" for k, v in params.items()) or "defaults"
            print(f"[{i}/{len(notebooks)}] {nb.stem} ({shown})", flush=True)
            dst = out_dir / nb.name
            start = time.perf_counter()
            status, error = "passed", None
            with temporary_environ({tracking.ENV_NOTEBOOK: nb.stem}):
                try:
                    cells = CellProgress(f"[{i}/{len(notebooks)}] {nb.stem}") if progress else None
                    execute_with_progress(nb, dst, params, timeout, cells)
                except Exception as e:  # one failing notebook must not stop the gallery
                    status = "failed"
                    error = (first_error(dst) if dst.exists() else None) or {"ename": type(e).__name__,
                                                                             "evalue": str(e)}
                result.seconds = round(time.perf_counter() - start, 1)
                result.status, result.error = status, error
                if dst.exists():
                    meta = record_metadata(dst)
                    result.output = str(dst.relative_to(run_dir))
                    result.metrics = meta.get("metrics", {})
                    result.host = meta.get("host", {})
                    result.tracking = meta.get("tracking")
                if report:
                    entry = complete_entry(run_dir, asdict(result))
                    result.html, result.figure = entry.get("html"), entry.get("figure")
                    result.error = entry.get("error")
                _track_after(result, run_dir, tracking_uri)
            print(f"    {status} in {result.seconds:.1f} s"
                  + (f": {error['ename']}: {str(error['evalue'])[:200]}" if error else ""), flush=True)
            summary = write_summary(results, run_dir, host, started=started, tracking_uri=tracking_uri)
            if report:
                write_index(run_dir, summary)
    return results


def write_summary(results: list[NotebookResult], run_dir: Path, host: dict[str, Any],
                  started: str | None = None, tracking_uri: str | None = None) -> dict[str, Any]:
    data = {"run": run_dir.name, "started": started, "host": host, "tracking_uri": tracking_uri,
            "notebooks": [asdict(r) for r in results]}
    write_json(run_dir / "summary.json", data, indent=2, default=str)  # whole, for a reader watching the run
    gpu_name = f" ({host['gpu_name']})" if host.get("gpu_name") else ""
    tracked = f"; tracking: `{tracking_uri}`" if tracking_uri else ""
    lines = [f"# Gallery run {run_dir.name}", "",
             f"Host: {host.get('hostname')}, {host.get('cpus')} CPUs, {host.get('gpus', 0)} GPU(s)"
             f"{gpu_name}, torch {host.get('torch')}", "",
             f"Report: [index.html](index.html){tracked}", "",
             "| notebook | status | seconds | parameters | metrics |", "|---|---|---|---|---|"]
    for r in results:
        params = ", ".join(f"{k}={v}" for k, v in r.parameters.items()) or "defaults"
        metrics = ", ".join(f"{k}={format_metric(v)}" for k, v in r.metrics.items())
        where = (f"In [{r.error['execution_count']}]" if r.error and r.error.get("execution_count")
                 else f"cell {r.error.get('cell')}" if r.error else "")
        status = r.status if not r.error else f"{r.status} ({r.error.get('ename')} in {where})"
        link = f"[{r.notebook}]({r.html or r.output})" if (r.html or r.output) else r.notebook
        seconds = "" if r.seconds is None else r.seconds
        lines.append(f"| {link} | {status} | {seconds} | {params} | {metrics} |")
    passed = sum(r.status == "passed" for r in results)
    failed = sum(r.status == "failed" for r in results)
    pending = len(results) - passed - failed
    lines += ["", f"{passed} passed, {failed} failed" + (f", {pending} pending" if pending else "")]
    atomic_write(run_dir / "summary.md", "\n".join(lines) + "\n")
    return data


def new_run_dir(runs_dir: Path) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = runs_dir / stamp
    suffix = 1
    while run_dir.exists():
        run_dir = runs_dir / f"{stamp}-{suffix}"
        suffix += 1
    run_dir.mkdir(parents=True)
    return run_dir
