"""The command line, `python tools/gpu_check --out DIR` (`--help` lists the options): `main` answers
`--publish` and the child's `--execute-job`, and `run` is the check itself (preflight, install, every selected
notebook within the budget, the report)."""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from helpers.paths import ROOT

from .bundle import DEFAULT_BUNDLE, DEFAULT_SITE, install_bundle
from .checks import CHECKS, NotebookCheck, select
from .environment import child_env, compat_problems, preflight, torch_info, versions, write_kernelspec
from .executor import Executor, execute_job, subprocess_executor
from .metrics import Expect, expectations
from .publish import PUBLISHED_PAGE, publish
from .report import archive, table, write_report
from .runner import DEFAULT_BUDGET_S, EXIT_OK, EXIT_PREFLIGHT, Context, Result, exit_status, run_checks


def build_parser() -> argparse.ArgumentParser:
    """The options; the description is the first line of the package's docstring."""
    parser = argparse.ArgumentParser(description=sys.modules[__package__].__doc__.split("\n\n")[0])
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
    return parser


def main(argv: list[str] | None = None, checks: tuple[NotebookCheck, ...] = CHECKS,
         executor: Executor = subprocess_executor) -> int:
    """The check's exit status (0 passed or skipped, 1 failed, 2 preflight failed); `checks` and `executor`
    are what the tests replace."""
    args = build_parser().parse_args(argv)
    if args.execute_job:
        return execute_job(args.execute_job)
    if args.publish:
        publish(PUBLISHED_PAGE, args.publish)
        print(f"gpu_check: wrote {PUBLISHED_PAGE.relative_to(ROOT)} from {len(args.publish)} report(s)")
        return EXIT_OK
    return run(args, checks, executor)


def run(args: argparse.Namespace, checks: tuple[NotebookCheck, ...], executor: Executor) -> int:
    """The whole check; report.json/.md are rewritten after each notebook, so a check cut short leaves one."""
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

    expect, site = prepare(args, info)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    jupyter = write_kernelspec(work / "jupyter")
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
    print(summary(results, status, info["seconds"], out), flush=True)
    return status


def prepare(args: argparse.Namespace, info: dict[str, Any]) -> tuple[Expect, Path | None]:
    """Install what this Python lacks from the bundle and record the GPU, the versions and the private APIs
    into `info`: what the metrics must say, and the site the kernels import from (None: nothing installed)."""
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
    return expect, args.site if bundle_info and bundle_info.get("installed") else None


def summary(results: list[Result], status: int, seconds: float, out: Path) -> str:
    """The last line printed: the verdict, the counts, the time and where the report is."""
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "skipped")}
    failed = len(results) - sum(counts.values())
    return (f"gpu_check: {'all passed' if status == EXIT_OK else 'FAILED'} ({counts['passed']} passed, "
            f"{counts['skipped']} skipped, {failed} failed) in {seconds:.0f} s; report: {out}/report.md")
