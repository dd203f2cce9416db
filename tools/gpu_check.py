"""One GPU check: every notebook's GPU path for a few steps, on a GPU machine without a package index.

    python tools/gpu_check.py --out DIR                  # on the GPU machine (make gpu-check)
    python tools/gpu_check.py --device cpu --only 05     # the same machinery on CPU, with CPU expectations

On the GPU machine, with this working tree and gpu-bundle/ (which `make gpu-bundle` fills where PyPI is
reachable) copied there, one command runs the whole check within `--budget-s` (580 s by default;
`--time-scale` stretches every limit for a slower machine):

  set -o pipefail; PYTHONUNBUFFERED=1 python3 tools/gpu_check.py --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"

What it does, in order, stopping early only where nothing else could work:
1. Preflight: imports torch and, for `--device cuda` (the default), checks `torch.cuda.is_available()`; if
   not, it says what it saw (torch build, CUDA_VISIBLE_DEVICES, nvidia-smi) and exits 2 before anything
   expensive.
2. Installs the carried wheels (`gpu-bundle/`, made by tools/gpu_bundle.py) that this Python lacks, with
   pip, from the folder only (`--no-index --no-deps`), into `--site` (a folder put first on PYTHONPATH for
   the check and every kernel it starts), so the machine's own torch, transformers... are the ones used.
3. Records the versions it runs with (Python, torch, CUDA, cuDNN, NCCL, the GPU and driver, transformers,
   TRL, DeepSpeed, Lightning...) and whether the private torch APIs the launcher uses are still there.
4. Executes each notebook with papermill (in a subprocess, with a wall-clock limit per notebook, all of
   them within `--budget-s`) at a few steps with `processes=1`, in its own kernel, so a notebook that
   fails, hangs or crashes does not stop the others. One GPU cannot hold 2 ranks, so the notebooks' 2-rank
   proofs run where each notebook sends them (2 CPU processes, or 1 GPU rank): the report says so per
   notebook. A notebook that needs what cannot be carried (06: Ray) is reported `skipped: <reason>`.
5. Reads what each notebook recorded (`record_metrics`) and asserts the run really used the device:
   device "cuda", backend "nccl", precision "bf16" where `torch.cuda.is_bf16_supported()` (else "fp16"),
   a peak GPU memory above 0 and a throughput above 0 (with `--device cpu`: "cpu", "gloo", "fp32").
6. Prints a table (notebook, status, seconds, peak GPU MB, throughput, what was skipped and why) and writes
   it to `--out` as report.json and report.md, with the executed notebooks and their logs as
   notebooks.tar.gz. Exit status: 0 when every notebook passed or was skipped for a stated reason, 1 when
   one failed or timed out, 2 when the preflight failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: this checkout's helpers
from helpers.gallery.catalog import CATALOG  # noqa: E402
from helpers.paths import NOTEBOOKS_DIR, ROOT, names_notebook  # noqa: E402

DEFAULT_BUNDLE = ROOT / "gpu-bundle"
DEFAULT_SITE = Path(tempfile.gettempdir()) / "gpu-check-site"
DEFAULT_BUDGET_S = 580  # the whole check, install included, on one H200 (--budget-s, --time-scale)
EXIT_OK, EXIT_FAILED, EXIT_PREFLIGHT = 0, 1, 2
MIN_START_S = 30  # a notebook is not started with less time than this left in the budget

# Lightning's precision names (notebook 03 records those) and the notebooks' own
PRECISION_NAMES = {"bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16", "16-mixed": "fp16",
                   "16-true": "fp16", "fp16": "fp16", "16": "fp16", "32-true": "fp32", "32": "fp32",
                   "fp32": "fp32"}

# The packages whose versions the report records (distribution names)
VERSIONS_OF = ("torch", "torchvision", "transformers", "tokenizers", "huggingface-hub", "accelerate", "trl",
               "datasets", "deepspeed", "lightning", "torchmetrics", "peft", "mosaicml-streaming",
               "pycocotools", "numpy", "pandas", "scikit-learn", "matplotlib", "pyarrow", "papermill",
               "nbclient", "ipykernel", "ray", "mlflow", "mlflow-skinny", "cloudpickle")


@dataclass(frozen=True)
class NotebookCheck:
    """How one notebook is checked: its few-step parameters, its time limit, what it records."""

    name: str
    limit_s: int  # wall clock for the whole notebook on one H200 (scaled by --time-scale)
    throughput: str  # the metric that holds its throughput
    parameters: dict[str, Any] = field(default_factory=dict)  # papermill parameters (processes is added)
    cpu_parameters: dict[str, Any] = field(default_factory=dict)  # overrides for --device cpu
    carried: tuple[str, ...] = ()  # modules the bundle brings: missing means the bundle is, a failure
    uncarried: tuple[str, ...] = ()  # modules that cannot be carried: missing means skipped
    uncarried_reason: str = ""
    note_one_process: str = ""  # what runs elsewhere (or not at all) when the notebook gets one GPU
    source: Path | None = None  # the notebook file (default: notebooks/<name>.ipynb)

    @property
    def path(self) -> Path:
        return self.source or NOTEBOOKS_DIR / f"{self.name}.ipynb"


# Each notebook's check is in its record of helpers/gallery/catalog.py (with why its limit is what it is).
CHECKS: tuple[NotebookCheck, ...] = tuple(
    NotebookCheck(nb.stem, **{f.name: getattr(nb.gpu_check, f.name) for f in fields(nb.gpu_check)})
    for nb in CATALOG if nb.gpu_check)


@dataclass(frozen=True)
class Expect:
    device: str
    backend: str
    precision: str


def expectations(device: str, bf16_supported: bool | None = None) -> Expect:
    """What the metrics must say: on a GPU, cuda/nccl and bf16 where the GPU has it (else fp16)."""
    if device == "cpu":
        return Expect("cpu", "gloo", "fp32")
    if bf16_supported is None:
        import torch

        bf16_supported = torch.cuda.is_bf16_supported()
    return Expect("cuda", "nccl", "bf16" if bf16_supported else "fp16")


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and value > 0


def check_metrics(metrics: dict[str, Any], expect: Expect, throughput: str,
                  processes: int | None = None) -> list[str]:
    """What is wrong with a notebook's recorded metrics for this device: [] when it really ran there."""
    if not metrics:
        return ["recorded no metrics (record_metrics did not run)"]
    problems = []
    for key in ("device", "backend"):
        if metrics.get(key) != getattr(expect, key):
            problems.append(f"{key} is {metrics.get(key)!r}, expected {getattr(expect, key)!r}")
    seen = metrics.get("precision")
    if PRECISION_NAMES.get(str(seen)) != expect.precision:
        problems.append(f"precision is {seen!r}, expected {expect.precision!r}")
    if not _positive_number(metrics.get(throughput)):
        problems.append(f"throughput {throughput} is {metrics.get(throughput)!r}, expected a number > 0")
    peak = metrics.get("peak_gpu_mb")
    if expect.device == "cuda" and not _positive_number(peak):
        problems.append(f"peak_gpu_mb is {peak!r}: nothing was allocated on the GPU")
    if expect.device == "cpu" and peak not in (None, 0, "None"):
        problems.append(f"peak_gpu_mb is {peak!r} on a CPU run")
    if processes is not None and metrics.get("processes") != processes:
        problems.append(f"processes is {metrics.get('processes')!r}, expected {processes}")
    return problems


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


@dataclass(frozen=True)
class Outcome:
    """What executing one notebook gave: exit code, whether it was killed at its limit, a log tail."""

    returncode: int
    timed_out: bool
    seconds: float
    log: str = ""


Executor = Callable[[Path, Path, dict[str, Any], float, dict[str, str]], Outcome]


def _kill_tree(pid: int) -> None:
    """End a process and everything it started: the kernel (its own session), forkserver, ranks."""
    try:
        import psutil

        try:
            parent = psutil.Process(pid)
            procs = [*parent.children(recursive=True), parent]
        except psutil.NoSuchProcess:
            return
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
    except ImportError:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def subprocess_executor(src: Path, dst: Path, parameters: dict[str, Any], limit_s: float,
                        env: dict[str, str]) -> Outcome:
    """Run one notebook with papermill in a child process, killed (with its kernel) at `limit_s`."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    job = dst.with_suffix(".job.json")
    job.write_text(json.dumps({"src": str(src), "dst": str(dst), "parameters": parameters,
                               "timeout": max(1, int(limit_s))}))
    log_path = dst.with_suffix(".log")
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--execute-job", str(job)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_tree(proc.pid)
            proc.wait()
    seconds = time.monotonic() - start
    text = log_path.read_text(errors="replace")
    return Outcome(proc.returncode, timed_out, seconds, text[-3000:])


def execute_job(job_path: str) -> int:
    """In the child: execute the notebook; the exit code and one line say how it went (this process imports
    papermill, not torch: the notebook's kernel and ranks do the GPU work)."""
    job = json.loads(Path(job_path).read_text())
    from helpers.gallery.execute import execute_notebook

    try:
        execute_notebook(job["src"], job["dst"], job["parameters"], timeout=job["timeout"])
    except Exception as e:
        name = type(e).__name__
        detail = f"{getattr(e, 'ename', '')}: {getattr(e, 'evalue', '')}" if hasattr(e, "ename") else str(e)
        print(f"gpu_check: {Path(job['src']).name} failed: {name}: {detail}"[:2000], flush=True)
        return 1
    return 0


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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


def runnable(check: NotebookCheck) -> bool:
    return all(importable(m) for m in check.uncarried)


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


# ---------------------------------------------------------------------------------------- reporting

def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def table(results: list[Result]) -> str:
    """The results as a markdown table (also what is printed)."""
    rows = ["| notebook | status | seconds | device / backend / precision | peak GPU MB | throughput | "
            "skipped, and why |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        seen = " / ".join(str(r.seen.get(k, "-")) for k in ("device", "backend", "precision")) \
            if r.seen else "-"
        throughput = f"{_fmt(r.throughput, 1)} {r.throughput_key.replace('_per_s', '/s')}" \
            if r.throughput is not None else "-"
        problems = "; ".join(" ".join(p.split())[:300] for p in r.problems)  # one line (report.json: all)
        notes = r.notes + ("" if not problems else (" **problems:** " if r.notes else "**problems:** ")
                           + problems)
        rows.append(f"| {r.notebook} | {r.status} | {_fmt(r.seconds, 1)} | {seen} | "
                    f"{_fmt(r.peak_gpu_mb, 1)} | {throughput} | {notes.replace('|', '/')} |")
    return "\n".join(rows)


def write_report(out: Path, results: list[Result], info: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    status = EXIT_PREFLIGHT if info.get("preflight") else exit_status(results)
    payload = {**info, "exit_status": status, "results": [asdict(r) for r in results]}
    (out / "report.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    lines = [f"# GPU check, {info.get('date', '')}", "",
             f"device {info.get('device')}: {info.get('gpu', {}).get('name', '-')}; expectations "
             f"{info.get('expect')}; processes per notebook: {info.get('processes')}; "
             f"{info.get('seconds', 0):.0f} s in all; exit status {status}", ""]
    if info.get("preflight"):
        lines += ["## Preflight failed: nothing was run", "", "```", info["preflight"], "```", ""]
    lines += [table(results), "", "## Versions", "", "| package | version |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in info.get("versions", {}).items()]
    if info.get("compat_problems"):
        lines += ["", "## Private torch APIs that moved", ""] + [f"- {p}" for p in info["compat_problems"]]
    bundle = info.get("bundle") or {}
    if bundle:
        installed = ", ".join(bundle.get("installed", [])) or "nothing"
        lines += ["", "## Bundle", "", f"installed into {bundle.get('site')}: {installed}", "",
                  f"already here (not installed): {json.dumps(bundle.get('already_present', {}))}"]
        if bundle.get("error"):
            lines += ["", f"error: {bundle['error']}"]
    (out / "report.md").write_text("\n".join(lines) + "\n")


PUBLISHED_PAGE = ROOT / "docs" / "gpu-check.md"
PUBLISHED_REPORTS = ROOT / "docs" / "gpu-check"


def published_page(reports: list[dict[str, Any]]) -> str:
    """docs/gpu-check.md from the kept report.json files: each notebook's newest result (a later report wins),
    the GPU and the versions it ran with. A check may run a few notebooks at a time (`--only`), so a page of
    one report would show only those. A skipped row gives the reason the check gives now (a skip is the
    check's decision, not a measurement), so the page never repeats a reason the code no longer states."""
    if not reports:
        raise ValueError("no GPU check report to publish: give the report.json files of `make gpu-check`")
    cpu = [r.get("device") for r in reports if r.get("device") != "cuda"]
    if cpu:
        raise ValueError(f"a report of a --device {cpu[0]} run is not a GPU result: publish only cuda runs")
    latest: dict[str, tuple[int, Result]] = {}
    reasons = {c.name: c.uncarried_reason for c in CHECKS if c.uncarried_reason}
    for i, report in enumerate(reports):
        for row in report.get("results", []):
            result = Result(**row)
            if result.status == "skipped" and result.notebook in reasons:
                missing = result.notes.rsplit("(missing: ", 1)
                result.notes = f"skipped: {reasons[result.notebook]}" + (
                    f" (missing: {missing[1]}" if len(missing) == 2 else "")
            latest[row["notebook"]] = (i, result)
    names = sorted(latest)
    results = [latest[n][1] for n in names]
    used = sorted({latest[n][0] for n in names})
    gpu = reports[used[-1]].get("gpu", {})
    lines = [
        "# The GPU check's results", "",
        "Written by `python tools/gpu_check.py --publish docs/gpu-check/*.json` from the `report.json` "
        "files that `make gpu-check` wrote on a GPU machine (kept in [docs/gpu-check/](gpu-check/)); each "
        "notebook's row is its newest result. [gpu.md](gpu.md) says what the check asserts and how to run "
        "it.", "",
        f"GPU: {gpu.get('name', '-')} ({gpu.get('memory_gib', '-')} GiB, compute capability "
        f"{gpu.get('capability', '-')}), driver and memory per nvidia-smi: {gpu.get('nvidia_smi', '-')}; "
        f"torch {gpu.get('torch', '-')}, CUDA {gpu.get('cuda', '-')}, cuDNN {gpu.get('cudnn', '-')}, "
        f"NCCL {gpu.get('nccl', '-')}; one process per notebook.", "",
        table(results), ""]
    versions = [reports[i].get("versions", {}) for i in used]
    keys = list(dict.fromkeys(k for v in versions for k in v))
    lines += ["## Versions", "", "| package | version |", "| --- | --- |"]
    for k in keys:
        seen = list(dict.fromkeys(str(v.get(k, "-")) for v in versions))
        lines.append(f"| {k} | {' / '.join(seen)} |")
    problems = list(dict.fromkeys(p for i in used for p in reports[i].get("compat_problems", [])))
    if problems:
        lines += ["", "## Private torch APIs that moved", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def publish(page: Path, report_paths: list[Path]) -> None:
    """Write the page, and keep a copy of each report beside it (the page is rebuilt from those)."""
    missing = [str(p) for p in report_paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"no report at {', '.join(missing)}: give the report.json files that "
                                "`make gpu-check` wrote (GPU_OUT, runs/gpu-check by default)")
    reports = [json.loads(p.read_text()) for p in report_paths]
    text = published_page(reports)   # checks them all before anything is written
    kept = page.parent / page.stem
    kept.mkdir(parents=True, exist_ok=True)
    for path, report in zip(report_paths, reports, strict=True):
        dest = kept / f"{report.get('date', path.parent.name).replace(':', '')}.json"
        if path.resolve() != dest.resolve():
            dest.write_text(json.dumps(report, indent=1) + "\n")
    page.write_text(text)


def archive(work: Path, out: Path) -> None:
    """The executed notebooks and their logs, as one file: one thing to bring back from the GPU machine."""
    files = sorted(p for p in work.iterdir() if p.suffix in (".ipynb", ".log"))
    if not files:
        return
    with tarfile.open(out / "notebooks.tar.gz", "w:gz") as tar:
        for p in files:
            tar.add(p, arcname=p.name)


# ----------------------------------------------------------------------------------- the environment

def distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_bundle(bundle: Path, site: Path) -> dict[str, Any]:
    """Install the bundle's wheels whose distribution this Python lacks into `site`, from the folder only."""
    manifest_path = bundle / "manifest.json"
    if not manifest_path.is_file():
        return {"bundle": str(bundle), "installed": [], "already_present": {},
                "error": f"no {manifest_path}: build it with `make gpu-bundle` and carry gpu-bundle/"}
    manifest = json.loads(manifest_path.read_text())
    present, wanted = {}, []
    for wheel in manifest["wheels"]:
        version = distribution_version(wheel["name"])
        if version is None:
            wanted.append(wheel)
        else:
            present[wheel["name"]] = version
    info: dict[str, Any] = {"bundle": str(bundle), "site": str(site), "installed": [],
                            "already_present": present}
    if not wanted:
        return info
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target", str(site),
           *[str(bundle / w["file"]) for w in wanted]]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    info["install_seconds"] = round(time.monotonic() - start, 1)
    if proc.returncode:
        info["error"] = f"pip install failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}"
        return info
    info["installed"] = [f"{w['name']}=={w['version']}" for w in wanted]
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    return info


def write_kernelspec(root: Path) -> Path:
    """A `python3` kernel spec for this interpreter, found first through JUPYTER_PATH: papermill's kernel
    is then the Python that runs the check (with its PYTHONPATH), whatever kernels the machine has."""
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (gpu check)", "language": "python", "metadata": {"debugger": False}}))
    return root


def child_env(device: str, site: Path | None, jupyter_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(site)] if site and site.is_dir() else []
    paths += [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["JUPYTER_PATH"] = os.pathsep.join([str(jupyter_path), *[p for p in env.get("JUPYTER_PATH", "").split(
        os.pathsep) if p]])
    env["GALLERY_TRACKING"] = "off"  # no MLflow (not carried); record_metrics still records
    # Jupyter's, IPython's and matplotlib's own folders next to the kernel spec, whatever $HOME allows
    own_dirs = {"JUPYTER_RUNTIME_DIR": "runtime", "IPYTHONDIR": "ipython", "MPLCONFIGDIR": "mpl"}
    for name, folder in own_dirs.items():
        env.setdefault(name, str(jupyter_path / folder))
    # nothing is downloaded (no network there): fail at once rather than wait for a hub's time-out
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # "auto" then means CPU processes, as on a machine without GPUs
    return env


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in VERSIONS_OF:
        found[name] = distribution_version(name) or "missing"
    return found


def torch_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info.update(
            name=torch.cuda.get_device_name(0), count=torch.cuda.device_count(),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
            bf16=torch.cuda.is_bf16_supported(), cudnn=torch.backends.cudnn.version(),
            nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None)
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            query = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
            out = subprocess.run(query, capture_output=True, text=True, timeout=30)
            info["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
        except (OSError, subprocess.SubprocessError) as e:
            info["nvidia_smi"] = f"failed: {e}"
    return info


def compat_problems() -> list[str]:
    """The launcher's private torch / standard-library APIs that are not where they were checked."""
    try:
        from helpers.launch import _compat
    except Exception as e:
        return [f"helpers.launch does not import: {type(e).__name__}: {e}"]
    problems = []
    for api in _compat.PRIVATE_APIS:
        if api.library == "ray":
            continue
        try:
            _compat.resolve(api)
        except Exception as e:
            problems.append(str(e))
    return problems


def preflight(device: str) -> str | None:
    """None when the device is usable; else what is wrong, in words a person can act on."""
    try:
        import torch
    except Exception as e:
        return f"torch does not import here ({type(e).__name__}: {e}): run with the Python that has torch."
    if device == "cpu" or torch.cuda.is_available():
        return None
    lines = [f"torch.cuda.is_available() is False: torch {torch.__version__} (built for CUDA "
             f"{torch.version.cuda or 'none: a CPU-only build'}), "
             f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!s}."]
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            lines.append(f"nvidia-smi -L: {(out.stdout or out.stderr).strip() or '(nothing)'}")
        except (OSError, subprocess.SubprocessError) as e:
            lines.append(f"nvidia-smi failed: {e}")
    else:
        lines.append("nvidia-smi is not on PATH: no NVIDIA driver here?")
    lines.append("Nothing was run. On a machine without a GPU, `--device cpu` checks the same machinery.")
    return "\n".join(lines)


def select(checks: tuple[NotebookCheck, ...], only: list[str]) -> list[NotebookCheck]:
    if not only:
        return list(checks)
    chosen = [c for c in checks if any(names_notebook(o, c.name) for o in only)]
    unknown = [o for o in only if not any(names_notebook(o, c.name) for c in checks)]
    if unknown:
        raise SystemExit(f"gpu_check: no notebook {unknown}; choose from {[c.name for c in checks]}")
    return chosen


def main(argv: list[str] | None = None, checks: tuple[NotebookCheck, ...] = CHECKS,
         executor: Executor = subprocess_executor) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda (default): assert cuda/nccl/bf16; cpu: the same machinery, CPU "
                        "expectations")
    parser.add_argument("--out", type=Path, default=None,
                        help="where report.json/.md and notebooks.tar.gz go (default runs/gpu-check-<stamp>)")
    parser.add_argument("--only", nargs="*", default=[], help="notebooks by number or name (default: all)")
    parser.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE,
                        help="the carried wheels (gpu-bundle/)")
    parser.add_argument("--site", type=Path, default=DEFAULT_SITE, help="where missing wheels are installed")
    parser.add_argument("--no-install", action="store_true", help="use only what this Python has")
    parser.add_argument("--notebooks", type=Path, default=None,
                        help="take the notebooks from this folder instead of notebooks/ (a patched copy)")
    parser.add_argument("--processes", default="1",
                        help="processes per notebook: 1 (default; 1 GPU is enough) or auto (every GPU)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"the whole check's wall clock (default {DEFAULT_BUDGET_S} s x --time-scale)")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="multiplies every notebook's limit (default 1 on cuda, 5 on cpu: a small CPU)")
    parser.add_argument("--publish", nargs="+", type=Path, metavar="REPORT_JSON",
                        help="write docs/gpu-check.md from these report.json files (newest result per "
                        "notebook) and keep a copy of each in docs/gpu-check/; runs nothing")
    parser.add_argument("--execute-job", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.execute_job:
        return execute_job(args.execute_job)
    if args.publish:
        publish(PUBLISHED_PAGE, args.publish)
        print(f"gpu_check: wrote {PUBLISHED_PAGE.relative_to(ROOT)} from {len(args.publish)} report(s)")
        return EXIT_OK

    started, stamp = time.monotonic(), dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "runs" / f"gpu-check-{stamp}"
    selected = select(checks, args.only)
    if args.notebooks:
        selected = [replace(c, source=args.notebooks / f"{c.name}.ipynb") for c in selected]
    scale = args.time_scale or (1.0 if args.device == "cuda" else 5.0)
    budget = args.budget_s or DEFAULT_BUDGET_S * scale
    processes = int(args.processes) if args.processes.isdigit() else args.processes
    info: dict[str, Any] = {"date": dt.datetime.now().isoformat(timespec="seconds"), "device": args.device,
                            "host": platform.node(), "libc": " ".join(platform.libc_ver()),
                            "python_executable": sys.executable, "processes": processes, "budget_s": budget,
                            "notebooks": [c.name for c in selected]}

    problem = preflight(args.device)
    if problem:
        print(f"gpu_check: preflight failed\n{problem}", file=sys.stderr, flush=True)
        info.update(preflight=problem, seconds=time.monotonic() - started, versions=versions())
        write_report(out, [], info)
        return EXIT_PREFLIGHT

    bundle_info = None if args.no_install else install_bundle(args.bundle, args.site)
    if bundle_info and bundle_info.get("error"):
        print(f"gpu_check: bundle: {bundle_info['error']}", file=sys.stderr, flush=True)
    if bundle_info and bundle_info.get("installed"):
        print(f"gpu_check: installed {len(bundle_info['installed'])} wheels into {args.site} "
              f"in {bundle_info.get('install_seconds')} s", flush=True)
    info["gpu"] = torch_info(args.device)
    expect = expectations(args.device, info["gpu"].get("bf16"))
    info.update(expect=asdict(expect), versions=versions(), bundle=bundle_info,
                compat_problems=compat_problems())
    print(f"gpu_check: {args.device} {info['gpu'].get('name', '')}; expecting {asdict(expect)}; "
          f"torch {info['gpu']['torch']} (CUDA {info['gpu']['cuda']}), transformers "
          f"{info['versions']['transformers']}", flush=True)
    for p in info["compat_problems"]:
        print(f"gpu_check: warning: {p}", file=sys.stderr, flush=True)

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    jupyter = write_kernelspec(work / "jupyter")
    site = args.site if bundle_info and bundle_info.get("installed") else None
    ctx = Context(device=args.device, expect=expect, processes=processes, work=work,
                  env=child_env(args.device, site, jupyter),
                  budget_s=budget - (time.monotonic() - started), time_scale=scale)

    def save(results: list[Result]) -> None:
        info["seconds"] = round(time.monotonic() - started, 1)
        write_report(out, results, info)

    results = run_checks(selected, ctx, executor, on_result=save)
    save(results)
    archive(work, out)
    shutil.rmtree(work, ignore_errors=True)
    print("\n" + table(results) + "\n", flush=True)
    status = exit_status(results)
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "skipped")}
    failed = len(results) - sum(counts.values())
    print(f"gpu_check: {'all passed' if status == EXIT_OK else 'FAILED'} ({counts['passed']} passed, "
          f"{counts['skipped']} skipped, {failed} failed) in {info['seconds']:.0f} s; report: "
          f"{out}/report.md", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
