"""Interactive use, for real: a Jupyter server, a kernel session, and the browser's websocket protocol.

The test starts `jupyter server` on loopback (free port, token), opens a notebook session through the
REST API like JupyterLab does, and talks to the kernel over the `/api/kernels/<id>/channels` websocket
(the JSON protocol a browser speaks). It runs notebook-01-style cells that launch `helpers.distributed`
on 2 CPU processes with a tiny function printing per rank, and checks:

* the ranks' lines arrive on iopub while the cell is still running (before its execute_reply);
* rank 0's `progress_bar` is one display in the cell, updated in place while the cell runs
  (`update_display_data`), ending at n == total; rank 1's bar is not drawn, and no `\r` reaches the output;
* an interrupt (`POST /api/kernels/<id>/interrupt`, the toolbar's stop button) during a long launch
  makes the cell raise KeyboardInterrupt, and the worker processes it started are gone;
* a second Run All of the same cells in the same kernel works;
* after the session and the server are shut down, no process the server started is left.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent

SETUP = """import os
import time

from helpers import distributed, progress_bar, worker_context"""
DEFINE = """@distributed(processes=2, device="cpu")
def tick(n, delay):
    ctx = worker_context()
    print(f"pid {os.getpid()} rank {ctx.rank} ready", flush=True)
    for i in progress_bar(range(n), desc="ticks", unit="tick"):
        time.sleep(delay)
        print(f"tick {i} rank {ctx.rank}", flush=True)
    return os.getpid()"""
LAUNCH = """pids = tick.distributed(6, 0.5)
print("returned", pids)"""
LONG_LAUNCH = "tick.distributed(10_000, 0.1)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, base: str, token: str, proc: subprocess.Popen, log: Path):
        self.base, self.token, self.proc, self.log = base, token, proc, log

    def request(self, method: str, path: str, body: dict | None = None) -> dict | None:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read()
        return json.loads(text) if text else None


@pytest.fixture
def jupyter_server(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), IPYTHONDIR=str(tmp_path / "ipython"),
               GALLERY_TRACKING="off")
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
             "--ServerApp.open_browser=False",
             f"--ServerApp.root_dir={ROOT}", "--ServerApp.shutdown_no_activity_timeout=600",
             *(["--allow-root"] if os.geteuid() == 0 else [])],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", token, proc, log)
    started: set[psutil.Process] = set()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"jupyter server exited: {log.read_text()[-2000:]}"
            try:
                server.request("GET", "/api/status")
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, (
                    f"jupyter server did not answer: {log.read_text()[-2000:]}")
                time.sleep(0.2)
        server.descendants = started  # the test adds every process it sees under the server
        yield server
    finally:
        started.update(_descendants(proc.pid))
        try:
            server.request("POST", "/api/shutdown")
        except Exception:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        left = _alive(started, timeout=15)
        for p in left:  # clean up before failing, by the ids we recorded
            p.kill()
        assert not left, f"processes left after the server shut down: {[(p.pid, p.name()) for p in left]}"


def _descendants(pid: int) -> set[psutil.Process]:
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return set()


def _alive(procs, timeout: float = 10.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class KernelChannel:
    """The kernel's websocket, spoken as JupyterLab does (JSON messages with a 'channel' field)."""

    def __init__(self, server: Server, kernel_id: str):
        import websocket

        self.session = uuid.uuid4().hex
        url = (server.base.replace("http://", "ws://")
               + f"/api/kernels/{kernel_id}/channels?session_id={self.session}")
        self.ws = websocket.create_connection(url, header=[f"Authorization: token {server.token}"],
                                              timeout=120)

    def execute(self, code: str, on_output=None, timeout: float = 120) -> dict:
        """Send an execute_request; collect its iopub output (with arrival times) until the reply and idle."""
        msg_id = uuid.uuid4().hex
        self.ws.send(json.dumps({
            "header": {"msg_id": msg_id, "username": "test", "session": self.session,
                       "msg_type": "execute_request", "version": "5.3",
                       "date": dt.datetime.now(dt.UTC).isoformat()},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))
        result = {"stream": [], "error": None, "reply": None, "reply_at": None, "displays": []}
        idle = False
        deadline = time.monotonic() + timeout
        while result["reply"] is None or not idle:
            assert time.monotonic() < deadline, f"no reply within {timeout} s; got {result}"
            msg = json.loads(self.ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream":
                result["stream"].append((time.monotonic(), msg["content"]["text"]))
                if on_output:
                    on_output(msg["content"]["text"])
            elif kind in ("display_data", "update_display_data"):
                result["displays"].append((time.monotonic(), kind, msg["content"]))
            elif kind == "error":
                result["error"] = msg["content"]
            elif kind == "execute_reply":
                result["reply"], result["reply_at"] = msg["content"], time.monotonic()
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
        return result

    def run_all(self, cells: list[str]) -> list[dict]:
        results = []
        for code in cells:
            results.append(self.execute(code))
            assert results[-1]["reply"]["status"] == "ok", results[-1]
        return results


def _text(result: dict) -> str:
    return "".join(text for _, text in result["stream"])


def _check_progress_bar(result: dict, total: int) -> None:
    """One bar (rank 0's), shown early, updated live, finished at n == total."""
    bars = [(t, kind, c) for t, kind, c in result["displays"] if "helpers_progress" in c.get("metadata", {})]
    assert bars, f"no progress bar was displayed; displays: {result['displays']}"
    assert bars[0][1] == "display_data", bars
    assert all(kind == "update_display_data" for _, kind, _ in bars[1:]), bars
    ids = {c["transient"]["display_id"] for _, _, c in bars}
    assert len(ids) == 1, f"more than one bar was drawn (rank 1's too?): {ids}"
    states = [c["metadata"]["helpers_progress"] for _, _, c in bars]
    assert states[-1]["n"] == total and states[-1]["total"] == total and states[-1]["closed"], states[-1]
    live = [t for (t, _, _), s in zip(bars, states, strict=True) if 0 < s["n"] < total]
    assert live and result["reply_at"] - live[0] > 1.0, "the bar did not move while the cell ran"
    assert f"{total}/{total}" in bars[-1][2]["data"]["text/plain"], bars[-1][2]["data"]


def test_rank_output_live_interrupt_and_rerun(jupyter_server):
    server = jupyter_server
    start = time.monotonic()
    session = server.request("POST", "/api/sessions", {
        "path": "notebooks/_interactive_check.ipynb", "name": "_interactive_check.ipynb", "type": "notebook",
        "kernel": {"name": "python3"}})
    kernel_id = session["kernel"]["id"]
    channel = KernelChannel(server, kernel_id)

    # Run All, first time: rank lines arrive while the cell runs
    *_, launch = channel.run_all([SETUP, DEFINE, LAUNCH])
    server.descendants.update(_descendants(server.proc.pid))
    names = [" ".join(p.cmdline()) for p in server.descendants]
    assert any("ipykernel" in n for n in names) and any("forkserver" in n for n in names), names
    text = _text(launch)
    for rank in (0, 1):
        assert f"[rank{rank}] tick 0 rank {rank}" in text and f"[rank{rank}] tick 5 rank {rank}" in text, text
    first_tick = next(t for t, s in launch["stream"] if "tick 0" in s)
    assert launch["reply_at"] - first_tick > 1.0, "rank output only arrived when the cell finished"
    pids = [int(p) for p in re.findall(r"returned \[(\d+), (\d+)\]", text)[0]]
    assert "\r" not in text, "a carriage return reached the cell's output"
    _check_progress_bar(launch, total=6)

    # Interrupt during a long launch: the cell raises KeyboardInterrupt, the workers are gone
    seen: dict[int, int] = {}
    interrupted = []

    def on_output(chunk: str) -> None:
        for rank, pid in ((int(r), int(p)) for p, r in re.findall(r"pid (\d+) rank (\d+) ready", chunk)):
            seen[rank] = pid
        if len(seen) == 2 and "tick 3 rank" in chunk and not interrupted:
            server.descendants.update(_descendants(server.proc.pid))
            server.request("POST", f"/api/kernels/{kernel_id}/interrupt")
            interrupted.append(time.monotonic())

    long = channel.execute(LONG_LAUNCH, on_output=on_output, timeout=90)
    assert interrupted, f"the workers never reported ready: {_text(long)[-1000:]}"
    assert long["reply"]["status"] == "error" and long["error"]["ename"] == "KeyboardInterrupt", long["error"]
    assert long["reply_at"] - interrupted[0] < 30, "the interrupt took too long to stop the launch"
    print(f"interrupt stopped the launch in {long['reply_at'] - interrupted[0]:.1f} s: "
          f"{long['error']['evalue']}")
    deadline = time.monotonic() + 10
    while any(_pid_alive(pid) for pid in seen.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in seen.values() if _pid_alive(pid)], "worker processes survived the interrupt"

    # Run All again in the same kernel: works, with new workers
    *_, again = channel.run_all([SETUP, DEFINE, LAUNCH])
    new_pids = [int(p) for p in re.findall(r"returned \[(\d+), (\d+)\]", _text(again))[0]]
    assert len(new_pids) == 2 and not set(new_pids) & (set(pids) | set(seen.values()))
    channel.ws.close()
    server.request("DELETE", f"/api/sessions/{session['id']}")
    assert time.monotonic() - start < 120, "much slower than the ~20 s it takes on 2 loaded cores"
