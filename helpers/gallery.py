"""Run the whole gallery (or some notebooks) as one job and write a summary.

    python -m helpers.gallery                              # every notebook, default parameters
    python -m helpers.gallery 01 04 -p processes=8         # by number or name; a parameter for all
    python -m helpers.gallery -p 04_fsdp_transformer:steps=5000 -p epochs=3

A parameter given as NAME=VALUE goes to every selected notebook that declares NAME; NOTEBOOK:NAME=VALUE
to that notebook only (an error if it does not declare it). Values are Python literals, else strings.
Everything is checked before the first notebook starts. A failing notebook does not stop the others;
the exit status is 0 only when all passed. Output: runs/<stamp>/ with the executed notebooks,
summary.json and summary.md.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from helpers.execute import execute_notebook, first_error, notebook_parameters, read_metrics

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = ROOT / "notebooks"


@dataclass
class NotebookResult:
    notebook: str
    status: str  # "passed" or "failed"
    seconds: float
    parameters: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    output: str = ""
    error: dict[str, Any] | None = None


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
        matches = [p for p in available if p.stem == stem or p.stem.split("_", 1)[0] == stem]
        if Path(name).suffix == ".ipynb" and Path(name).exists():
            matches = [Path(name).resolve()]
        if len(matches) != 1:
            raise SystemExit(
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
            raise SystemExit(f"-p {item!r}: write NAME=VALUE or NOTEBOOK:NAME=VALUE")
        key, value = item.split("=", 1)
        target, _, name = key.rpartition(":")
        value = _literal(value)
        if target:
            nb = discover([target], notebooks[0].parent if notebooks else NOTEBOOKS_DIR)[0]
            if nb not in per_nb:
                raise SystemExit(f"-p {item!r}: {nb.stem} is not among the notebooks selected to run")
            if name not in declared[nb]:
                raise SystemExit(f"-p {item!r}: {nb.stem} has no parameter {name!r}; it has {sorted(declared[nb])}")
            per_nb[nb][name] = value
        else:
            takers = [nb for nb in notebooks if name in declared[nb]]
            if not takers:
                raise SystemExit(f"-p {item!r}: no selected notebook declares a parameter {name!r}")
            for nb in takers:
                per_nb[nb].setdefault(name, value)
    # Notebook-specific values win over global ones whatever their order on the command line.
    for item in items:
        key, value = item.split("=", 1)
        target, _, name = key.rpartition(":")
        if target:
            per_nb[discover([target], notebooks[0].parent)[0]][name] = _literal(value)
    return per_nb


def host_info() -> dict[str, Any]:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "hostname": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
        "cpus": os.cpu_count(), "gpus": gpus,
        "gpu_name": torch.cuda.get_device_name(0) if gpus else None,
    }


def run_gallery(notebooks: list[Path], overrides: dict[Path, dict[str, Any]], run_dir: Path,
                timeout: int, progress: bool = True) -> list[NotebookResult]:
    results = []
    out_dir = run_dir / "notebooks"
    out_dir.mkdir(parents=True, exist_ok=True)
    for i, nb in enumerate(notebooks, 1):
        params = overrides.get(nb, {})
        shown = " ".join(f"{k}={v!r}" for k, v in params.items()) or "defaults"
        print(f"[{i}/{len(notebooks)}] {nb.stem} ({shown})", flush=True)
        dst = out_dir / nb.name
        start = time.perf_counter()
        status, error = "passed", None
        try:
            execute_notebook(nb, dst, params, timeout=timeout, progress=progress)
        except Exception as e:  # one failing notebook must not stop the gallery
            status = "failed"
            error = (first_error(dst) if dst.exists() else None) or {"ename": type(e).__name__, "evalue": str(e)}
        seconds = time.perf_counter() - start
        metrics = read_metrics(dst) if dst.exists() else {}
        result = NotebookResult(nb.stem, status, round(seconds, 1), params, metrics,
                                str(dst.relative_to(run_dir)), error)
        results.append(result)
        print(f"    {status} in {seconds:.1f} s" + (f": {error['ename']}: {error['evalue']}" if error else ""),
              flush=True)
    return results


def write_summary(results: list[NotebookResult], run_dir: Path, host: dict[str, Any]) -> None:
    data = {"run": run_dir.name, "host": host, "notebooks": [asdict(r) for r in results]}
    (run_dir / "summary.json").write_text(json.dumps(data, indent=2, default=str))
    lines = [f"# Gallery run {run_dir.name}", "",
             f"Host: {host['hostname']}, {host['cpus']} CPUs, {host['gpus']} GPU(s)"
             + (f" ({host['gpu_name']})" if host["gpu_name"] else "") + f", torch {host['torch']}", "",
             "| notebook | status | seconds | parameters | metrics |", "|---|---|---|---|---|"]
    for r in results:
        params = ", ".join(f"{k}={v}" for k, v in r.parameters.items()) or "defaults"
        metrics = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.metrics.items())
        status = r.status if not r.error else f"{r.status} ({r.error.get('ename')} in cell {r.error.get('cell')})"
        lines.append(f"| [{r.notebook}]({r.output}) | {status} | {r.seconds} | {params} | {metrics} |")
    passed = sum(r.status == "passed" for r in results)
    lines += ["", f"{passed} passed, {len(results) - passed} failed"]
    (run_dir / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.gallery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="names, stems or numbers (default: all)")
    parser.add_argument("-p", "--parameter", action="append", default=[], metavar="[NB:]NAME=VALUE")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"), help="where run folders go")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds a cell may run")
    parser.add_argument("--no-progress", action="store_true", help="no per-cell progress bar")
    parser.add_argument("--list", action="store_true", help="list notebooks and their parameters, run nothing")
    args = parser.parse_args(argv)

    notebooks = discover(args.notebooks)
    if not notebooks:
        raise SystemExit(f"no notebooks found in {NOTEBOOKS_DIR}")
    if args.list:
        for nb in notebooks:
            print(nb.stem, notebook_parameters(nb))
        return 0
    overrides = parse_overrides(args.parameter, notebooks)

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.runs_dir) / stamp
    suffix = 1
    while run_dir.exists():
        run_dir = Path(args.runs_dir) / f"{stamp}-{suffix}"
        suffix += 1
    run_dir.mkdir(parents=True)
    host = host_info()
    print(f"gallery run {run_dir} on {host['cpus']} CPUs, {host['gpus']} GPU(s)", flush=True)
    results = run_gallery(notebooks, overrides, run_dir, args.timeout, progress=not args.no_progress)
    write_summary(results, run_dir, host)
    print((run_dir / "summary.md").read_text())
    return 0 if all(r.status == "passed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
