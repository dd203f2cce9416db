"""Every notebook's check, in order, within one budget: each gets its own limit plus what earlier ones left
unused (never what later ones need), one failing never stops the next, and its recorded metrics decide."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checks import NotebookCheck, importable, runnable
from .executor import Executor, subprocess_executor
from .metrics import Expect, check_metrics

DEFAULT_BUDGET_S = 580  # the whole check, install included, on one H200 (--budget-s, --time-scale)
EXIT_OK, EXIT_FAILED, EXIT_PREFLIGHT = 0, 1, 2
MIN_START_S = 30  # a notebook is not started with less time than this left in the budget


@dataclass
class Result:
    notebook: str
    status: str  # passed, failed, timeout, skipped
    seconds: float | None = None
    peak_gpu_mb: float | None = None
    throughput: float | None = None
    throughput_key: str = ""
    seen: dict[str, Any] = field(default_factory=dict)  # device, backend, precision, processes recorded
    notes: str = ""  # what was skipped (and why), inside the notebook or the whole notebook
    problems: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    limit_s: float | None = None


def time_limit(limit_s: float, scale: float, remaining_s: float, reserve_s: float = 0.0) -> float | None:
    """The notebook's limit: its own, plus what earlier notebooks left unused beyond `reserve_s` (the limits
    of the notebooks still to run), within what is left of the budget; None when too little is left."""
    own = limit_s * scale
    limit = min(max(own, remaining_s - reserve_s), remaining_s)
    return limit if limit >= min(MIN_START_S, own) else None


@dataclass
class Context:
    device: str  # "cuda" or "cpu"
    expect: Expect
    processes: Any  # 1, or "auto"
    work: Path  # executed notebooks and logs
    env: dict[str, str]
    budget_s: float
    time_scale: float = 1.0
    started: float = field(default_factory=time.monotonic)

    def remaining(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)


def run_one(check: NotebookCheck, ctx: Context, executor: Executor, reserve_s: float = 0.0) -> Result:
    parameters = {**check.parameters, **(check.cpu_parameters if ctx.device == "cpu" else {}),
                  "processes": ctx.processes}
    result = Result(check.name, "failed", parameters=parameters, throughput_key=check.throughput,
                    notes=check.note_one_process if ctx.processes == 1 else "")
    missing_uncarried = [m for m in check.uncarried if not importable(m)]
    if missing_uncarried:
        result.status = "skipped"
        result.notes = f"skipped: {check.uncarried_reason} (missing: {', '.join(missing_uncarried)})"
        return result
    missing = [m for m in check.carried if not importable(m)]
    if missing:
        result.problems.append(f"missing {', '.join(missing)}: build the bundle (make gpu-bundle) and carry "
                               "gpu-bundle/ (it installs the wheels this Python lacks)")
        return result
    limit = time_limit(check.limit_s, ctx.time_scale, ctx.remaining(), reserve_s)
    if limit is None:
        result.problems.append(f"not run: {max(0, ctx.remaining()):.0f} s left of the {ctx.budget_s:.0f} s "
                               "budget")
        return result
    result.limit_s = round(limit, 1)
    dst = ctx.work / f"{check.name}.ipynb"
    outcome = executor(check.path, dst, parameters, limit, ctx.env)
    result.seconds = round(outcome.seconds, 1)
    metrics, error = {}, None
    if dst.exists():
        from helpers.gallery.notebook_io import first_error, read_metrics

        try:
            metrics, error = read_metrics(dst), first_error(dst)
        except Exception as e:  # a notebook written half-way
            result.problems.append(f"could not read the executed notebook: {type(e).__name__}: {e}")
    result.seen = {k: metrics.get(k) for k in ("device", "backend", "precision", "processes") if k in metrics}
    result.peak_gpu_mb = metrics.get("peak_gpu_mb")
    result.throughput = metrics.get(check.throughput)
    if outcome.timed_out:
        result.status = "timeout"
        result.problems.append(f"stopped at its {limit:.0f} s limit"
                               + (f" (last error: cell {error['cell']} {error['ename']})" if error else ""))
        return result
    if outcome.returncode != 0 or error:
        where = (f"cell {error['cell']} ({error['code']}) raised {error['ename']}: {error['evalue']}" if error
                 else f"exit code {outcome.returncode}: {outcome.log.strip().splitlines()[-1:] or ''}")
        result.problems.append(where[:1500])
        return result
    problems = check_metrics(metrics, ctx.expect, check.throughput,
                             processes=ctx.processes if isinstance(ctx.processes, int) else None)
    result.problems += problems
    result.status = "failed" if problems else "passed"
    return result


def run_checks(checks: list[NotebookCheck] | tuple[NotebookCheck, ...], ctx: Context,
               executor: Executor = subprocess_executor,
               on_result: Callable[[list[Result]], None] | None = None) -> list[Result]:
    """Every check, in order; one failing (or raising) never stops the next. `on_result` gets the results
    so far after each (the report is rewritten, so a check cut short still leaves one)."""
    results: list[Result] = []
    checks = list(checks)
    for i, check in enumerate(checks):
        print(f"gpu_check: {check.name} ...", flush=True)
        reserve = sum(c.limit_s * ctx.time_scale for c in checks[i + 1:] if runnable(c))
        try:
            result = run_one(check, ctx, executor, reserve)
        except Exception as e:  # the check's own machinery: report it, carry on
            result = Result(check.name, "failed", problems=[f"gpu_check error: {type(e).__name__}: {e}"])
        results.append(result)
        print(f"gpu_check: {check.name}: {result.status}"
              + (f" in {result.seconds:.0f} s" if result.seconds is not None else "")
              + (f" ({'; '.join(result.problems)})" if result.problems else ""), flush=True)
        if on_result:
            on_result(results)
    return results


def exit_status(results: list[Result]) -> int:
    return EXIT_OK if results and all(r.status in ("passed", "skipped") for r in results) else EXIT_FAILED

