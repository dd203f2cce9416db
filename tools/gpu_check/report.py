"""What a check leaves: the results as a table (printed, and in report.md), report.json with everything it
recorded, and the executed notebooks with their logs as notebooks.tar.gz."""

from __future__ import annotations

import json
import tarfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .runner import EXIT_PREFLIGHT, Result, exit_status


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



def archive(work: Path, out: Path) -> None:
    """The executed notebooks and their logs, as one file: one thing to bring back from the GPU machine."""
    files = sorted(p for p in work.iterdir() if p.suffix in (".ipynb", ".log"))
    if not files:
        return
    with tarfile.open(out / "notebooks.tar.gz", "w:gz") as tar:
        for p in files:
            tar.add(p, arcname=p.name)

