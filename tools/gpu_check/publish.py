"""docs/gpu-check.md, written from the kept report.json files of GPU runs (`--publish`), with a copy of each
report kept in docs/gpu-check/ so the page can always be rebuilt from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.paths import ROOT

from .checks import CHECKS
from .report import table
from .runner import Result

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
        "Written by `python tools/gpu_check --publish docs/gpu-check/*.json` from the `report.json` "
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

