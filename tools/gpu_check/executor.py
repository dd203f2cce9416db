"""One notebook under papermill, in a child process killed (with its kernel and ranks) at its time limit, so
a notebook that hangs or crashes never stops the check; the child is this package's `--execute-job`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parent  # `python tools/gpu_check` runs it


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
        proc = subprocess.Popen([sys.executable, str(PACKAGE), "--execute-job", str(job)],
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
