"""Run benchmarks and write what they print into docs/benchmarks.md, each table headed by its machine.

A figure belongs to the machine that measured it, so the page never holds a typed number: every table in
it was written here, between markers (`<!-- bench:NAME -->` ... `<!-- /bench:NAME -->`, one section per
script), under a line naming the CPU model, the CPUs this process may use, the CPU's vector instruction
set (AVX2, AVX-512, AMX), the torch version and the exact command. A script run again replaces its own
section; the sections of the scripts not run keep what they last held. Each script writes its report to
the file its `--markdown` option names, so rank output and progress lines on its stdout stay out of it.

Every run also rewrites the page's notebook run times (`<!-- notebook-times -->`): each stored notebook's
wall time at its defaults, read from the cell timings the stored run left in the notebook, and the devices
it recorded (`helpers.record_metrics`). That needs no benchmark run (`--notebook-times` does only that), and
tests/test_benchmarks_doc.py holds the section to the stored notebooks.

    python benchmarks/write_docs.py                    # the quick ones: what `make bench` runs
    python benchmarks/write_docs.py --only rank_gc,ray_start
    python benchmarks/write_docs.py --all
    python benchmarks/write_docs.py --notebook-times   # rewrite the notebook times only
    python benchmarks/write_docs.py --args "launcher_throughput=--rounds 3"   # shorter: the header says so
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT))

# What `make bench` runs: the shortest, and the launcher's own figures.
QUICK = ("launch_latency", "progress_overhead", "launcher_throughput")
# What --all adds: longer runs (notebook runs, the fine-tuning stack's imports, Ray instances, conv nets).
# setup_time.py (two environments from empty caches, from PyPI) runs only when --only names it;
# reference_spread.py writes its own page (docs/reference-check.md) and is not run from here.
SLOW = ("rank_gc", "cpu_quota", "ray_start", "nbval_variant_cost", "map_backends", "driver_memory_03")
NAMED_ONLY = ("setup_time",)
SCRIPTS = QUICK + SLOW + NAMED_ONLY

NOTEBOOK_TIMES = ("<!-- notebook-times -->", "<!-- /notebook-times -->")
MACHINE_PREFIX = "Machine: "


def markers(name: str) -> tuple[str, str]:
    """The opening and closing markers of a benchmark's section."""
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def machine_line() -> str:
    """One line naming what a benchmark ran on: CPU model, usable CPUs, instruction set, torch version."""
    from helpers.cpus import usable_cpus
    from helpers.host import cpu_model, instruction_sets

    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = "not installed"
    capped = os.environ.get("ATEN_CPU_CAPABILITY")
    isa = instruction_sets() + (f" (kernels capped: ATEN_CPU_CAPABILITY={capped})" if capped else "")
    return (f"{MACHINE_PREFIX}{cpu_model()}, {usable_cpus()} CPUs usable of {os.cpu_count()}, {isa}, "
            f"torch {torch}, Python {platform.python_version()}")


def replace_section(page: str, start: str, end: str, body: str, heading: str) -> str:
    """`page` with `body` between `start` and `end`; a section not there yet is added at the end of the page.

    Raises ValueError when a marker is there more than once or without its partner: the page was edited by
    hand, and a guess at which copy is meant would lose a table.
    """
    count_start, count_end = page.count(start), page.count(end)
    if (count_start, count_end) == (0, 0):
        return page.rstrip("\n") + f"\n\n{heading}\n\n{start}\n{body.strip()}\n{end}\n"
    if (count_start, count_end) != (1, 1) or page.index(start) > page.index(end):
        raise ValueError(f"the page: expected one {start} before one {end}, found "
                         f"{count_start} and {count_end}; repair the page by hand (git diff shows the edit).")
    head, rest = page.split(start)
    return f"{head}{start}\n{body.strip()}\n{end}{rest.split(end, 1)[1]}"


def section_body(page: str, start: str, end: str) -> str | None:
    """What lies between the markers, stripped; None when the section is missing."""
    if page.count(start) != 1 or page.count(end) != 1:
        return None
    return page.split(start, 1)[1].split(end, 1)[0].strip()


def _stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def notebook_seconds(path: Path) -> float | None:
    """Wall time of a stored notebook's run: its first cell's start to its last cell's reply (kernel start-up
    left out), from the `execution` timings nbclient and papermill store in each cell; None if not stored."""
    nb = json.loads(path.read_text())
    starts, ends = [], []
    for cell in nb.get("cells", []):
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in timing:
            starts.append(_stamp(timing.get("iopub.status.busy", timing["iopub.execute_input"])))
        if "shell.execute_reply" in timing:
            ends.append(_stamp(timing.get("iopub.status.idle", timing["shell.execute_reply"])))
    if not starts or not ends:
        return None
    return (max(ends) - min(starts)).total_seconds()


def _devices(host: dict) -> str:
    """What the notebook's run recorded of its machine (helpers.metrics): CPU, usable CPUs, instruction sets,
    torch, GPUs."""
    if not host:
        return "not recorded"
    cpus = f"{host['cpus']} CPUs" if host.get("cpus") else "CPUs not recorded"
    parts = [host["cpu"]] if host.get("cpu") else []
    parts.append(cpus)
    if host.get("instruction_sets"):
        parts.append(host["instruction_sets"])
    if host.get("torch"):
        parts.append(f"torch {host['torch']}")
    parts.append(f"{host['gpus']} x {host.get('gpu_name') or 'GPU'}" if host.get("gpus") else "no GPU")
    return ", ".join(parts)


def notebook_times_table(notebooks: Path = NOTEBOOKS) -> str:
    """The markdown table of each stored notebook's default-run wall time and the devices it recorded."""
    from helpers.gallery.notebook_io import record_metadata

    rows = ["| notebook | stored run (s) | ran on |", "|---|---:|---|"]
    total = 0.0
    for path in sorted(notebooks.glob("[0-9]*.ipynb")):
        seconds = notebook_seconds(path)
        total += seconds or 0.0
        shown = "not stored" if seconds is None else f"{seconds:.0f}"
        rows.append(f"| `{path.stem}` | {shown} | {_devices(record_metadata(path).get('host', {}))} |")
    rows.append(f"| all of them | {total:.0f} | |")
    return "\n".join(rows)


def run_script(name: str, extra: list[str], folder: Path) -> tuple[str | None, int, str]:
    """Run benchmarks/NAME.py with `--markdown`; (its report or None, its exit status, how it ran).

    The script's own output goes to this terminal as it comes: a long benchmark shows its progress. How it
    ran: the command, and the load average as it started (other work on a shared machine slows some rows).
    """
    report = folder / f"{name}.md"
    command = [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *extra, "--markdown", str(report)]
    shown = " ".join(["python", f"benchmarks/{name}.py", *map(shlex.quote, extra)])
    load = f"{os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else "unknown"
    print(f"\n== {shown}", flush=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    status = subprocess.run(command, cwd=ROOT, env=env).returncode
    ran = f"Command: `{shown}`, started at a load average of {load}"
    return (report.read_text() if report.is_file() else None), status, ran


def benchmark_section(report: str, status: int, ran: str, machine: str) -> str:
    """A section's body: the machine, how it ran (and a non-zero exit status), then the script's report."""
    exit_note = f"; exit status {status} (see the script's docstring)" if status else ""
    return f"{machine}.\n{ran}{exit_note}.\n\n{report.strip()}"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--only", metavar="NAMES", help="comma-separated scripts: " + ", ".join(SCRIPTS))
    which.add_argument("--all", action="store_true", help="the quick ones and " + ", ".join(SLOW))
    which.add_argument("--notebook-times", action="store_true",
                       help="rewrite only the notebook run times (no benchmark runs)")
    parser.add_argument("--args", action="append", default=[], metavar="NAME=ARGS",
                        help='options for one script, e.g. "launch_latency=--runs 3" (repeatable)')
    parser.add_argument("--page", help="the page to write instead of docs/benchmarks.md (a copy, to try a "
                        "script without publishing its figures)")
    args = parser.parse_args(argv)
    names = ([] if args.notebook_times else list(QUICK + SLOW) if args.all
             else [n.strip().removesuffix(".py") for n in args.only.split(",") if n.strip()] if args.only
             else list(QUICK))
    unknown = [n for n in names if n not in SCRIPTS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {', '.join(SCRIPTS)}")
    args.names = names
    args.extra = {}
    for item in args.args:
        name, sep, options = item.partition("=")
        if not sep or name.strip() not in SCRIPTS:
            parser.error(f"--args {item!r}: write NAME=OPTIONS with NAME one of {', '.join(SCRIPTS)}")
        args.extra[name.strip()] = shlex.split(options)
    return args


def page_problems(page: str, notebooks: Path = NOTEBOOKS) -> list[str]:
    """What is wrong with the page's written sections, each with its fix: stale notebook times, a benchmark
    section without its machine line or its table, markers without partners, sections naming no script."""
    problems = []
    times = section_body(page, *NOTEBOOK_TIMES)
    if times is None:
        problems.append(f"no single {NOTEBOOK_TIMES[0]} ... {NOTEBOOK_TIMES[1]} section (put the pair back, "
                        "empty, under '## Notebook run times', then run the fix below)")
    elif times != notebook_times_table(notebooks):
        problems.append("the notebook run times differ from the stored notebooks "
                        "(python benchmarks/write_docs.py --notebook-times)")
    opened = re.findall(r"<!-- bench:([\w-]+) -->", page)
    closed = re.findall(r"<!-- /bench:([\w-]+) -->", page)
    if sorted(opened) != sorted(set(opened)) or sorted(opened) != sorted(closed):
        problems.append(f"unbalanced benchmark markers: opened {opened}, closed {closed}")
    for name in QUICK:
        if name not in opened:
            problems.append(f"no section for {name}.py (make bench writes it)")
    for name in dict.fromkeys(opened):
        if name not in SCRIPTS:
            problems.append(f"a section for {name}, which is no script this runner knows (remove it)")
            continue
        fix = f"python benchmarks/write_docs.py --only {name}"
        body = section_body(page, *markers(name)) or ""
        if not re.match(rf"{MACHINE_PREFIX}.+, \d+ CPUs usable of \d+, .+, torch \S+", body):
            problems.append(f"{name}: the section does not open with its machine line ({fix})")
        if not re.search(r"^\|.*\|\s*$", body, re.M):
            problems.append(f"{name}: the section holds no table ({fix})")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    target = Path(args.page) if args.page else PAGE
    times = notebook_times_table()
    target.write_text(replace_section(target.read_text(), *NOTEBOOK_TIMES, times, "## Notebook run times"))
    print(f"wrote the notebook run times into {target}")
    failed = []
    machine = machine_line() if args.names else ""
    with tempfile.TemporaryDirectory(prefix="bench-docs-") as folder:
        for name in args.names:
            report, status, ran = run_script(name, args.extra.get(name, []), Path(folder))
            if report is None:
                failed.append(f"{name} (exit status {status}, no report: its section keeps what it held)")
                continue
            page = replace_section(target.read_text(), *markers(name),
                                   benchmark_section(report, status, ran, machine), f"### {name}.py")
            target.write_text(page)  # after each script: an interrupted run keeps what it measured
            print(f"wrote {name}.py's table into {target}")
            if status:
                failed.append(f"{name} (exit status {status})")
    if failed:
        print("not clean: " + "; ".join(failed), file=sys.stderr)
    return 1 if failed else 0




if __name__ == "__main__":
    raise SystemExit(main())
