"""The gallery report: rendering, index.html in a real headless browser, and --compare.

The browser test uses Debian's chromium (installed with apt-get by the test when missing: about 30 s,
once) driven over the DevTools protocol (websocket-client), on the synthetic gallery run of
tests/test_gallery_runner.py served by a local http.server.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import signal
import struct
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from helpers.gallery import __main__ as cli
from helpers.gallery import compare
from helpers.gallery.errors import USAGE_ERROR, GalleryError

# --- compare (no kernel) ------------------------------------------------------------------------------


def _summary(tmp_path: Path, name: str, notebooks: dict) -> Path:
    entries = [{"notebook": nb, "status": e.get("status", "passed"), "seconds": e.get("seconds", 10.0),
                "metrics": e["metrics"]} for nb, e in notebooks.items()]
    path = tmp_path / name / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run": name, "notebooks": entries}))
    return path.parent


BEFORE = {"01_mlp": {"metrics": {"test_accuracy": 0.97, "final_train_loss": 0.10, "parity_max_abs_diff": 1e-8,
                                 "processes": 2, "device": "cpu", "train_seconds": 30.0, "widgets": 1.0}},
          "02_det": {"metrics": {"map": 0.50}}}


def _after(**changes) -> dict:
    after = json.loads(json.dumps(BEFORE))
    for key, value in changes.items():
        nb, metric = key.split("__")
        if metric == "status":
            after[nb]["status"] = value
        else:
            after[nb]["metrics"][metric] = value
    return after


def _compare(tmp_path, after, *args) -> tuple[int, str]:
    import contextlib
    import io

    a, b = _summary(tmp_path, "a", BEFORE), _summary(tmp_path, "b", after)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli.main(["--compare", str(a), str(b), *args])
    return status, out.getvalue()


def test_compare_same_within_tolerance(tmp_path):
    status, out = _compare(tmp_path, _after(**{"01_mlp__test_accuracy": 0.965,
                                               "01_mlp__parity_max_abs_diff": 3e-8,
                                               "01_mlp__train_seconds": 90.0}))
    assert status == 0, out
    assert "0 regression(s)" in out and "train_seconds" not in out  # timings skipped by default


def test_compare_flags_regressions_by_direction(tmp_path):
    status, out = _compare(tmp_path, _after(**{"01_mlp__test_accuracy": 0.80, "01_mlp__final_train_loss": 0.2,
                                               "02_det__map": 0.6}))
    assert status == 1
    lines = {line.split()[1]: line for line in out.splitlines()[1:-1]}
    assert "REGRESSION (higher is better)" in lines["test_accuracy"] and "-17.53%" in lines["test_accuracy"]
    assert "REGRESSION (lower is better)" in lines["final_train_loss"]
    assert "IMPROVED" in lines["map"]
    assert out.splitlines()[-1].endswith("1 improved, 2 regression(s), 0 other change(s)")


def test_compare_tolerances_directions_and_configuration(tmp_path):
    after = _after(**{"01_mlp__test_accuracy": 0.90, "01_mlp__widgets": 2.0, "01_mlp__processes": 1,
                      "01_mlp__device": "cuda"})
    status, out = _compare(tmp_path, after)
    assert status == 1 and "widgets" in out and "direction unknown" in out
    assert "CHANGED (configuration or count)" in out  # processes / device: not regressions
    status, out = _compare(tmp_path, after, "--tolerance", "test_accuracy=0.1",
                           "--direction", "widgets=higher")
    assert status == 0, out
    status, out = _compare(tmp_path, after, "--tolerance", "0.5", "--tolerance", "01_mlp:test_accuracy=0.01",
                           "--direction", "widgets=higher")
    assert status == 1 and "test_accuracy" in out


def test_compare_status_timings_and_baseline_json(tmp_path):
    status, out = _compare(tmp_path, _after(**{"02_det__status": "failed"}))
    assert status == 1 and "the notebook now fails" in out
    status, out = _compare(tmp_path, _after(**{"01_mlp__train_seconds": 90.0}), "--timings")
    assert status == 1 and "train_seconds" in out
    baseline = tmp_path / "baseline.json"  # the short form: {notebook: {metric: value}}
    baseline.write_text(json.dumps({"02_det": {"map": 0.55}}))
    b = _summary(tmp_path, "b2", BEFORE)
    assert compare.run_compare(str(baseline), str(b)) == 1
    assert compare.run_compare(str(baseline), str(b), ["0.2"]) == 0
    with pytest.raises(GalleryError, match="no such run folder"):
        compare.load_run(tmp_path / "nowhere")
    assert cli.main(["--compare", str(tmp_path / "nowhere"), str(b)]) == USAGE_ERROR
    assert cli.main(["--report", str(tmp_path / "nowhere")]) == USAGE_ERROR


def test_compare_real_run_with_itself_and_a_better_baseline(synthetic_run, tmp_path, capsys):  # noqa: F811
    run_dir = synthetic_run["run_dir"]
    assert cli.main(["--compare", str(run_dir), str(run_dir)]) == 0
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"02_ok": {"score": 1.5},
                                    "01_fails": {"status": "passed", "metrics": {}}}))
    assert cli.main(["--compare", str(baseline), str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "02_ok" in out and "score" in out and "the notebook now fails" in out


# --- rendering -----------------------------------------------------------------------------------------

def test_rendered_pages_are_self_contained(synthetic_run):  # noqa: F811
    run_dir = synthetic_run["run_dir"]
    for page in [run_dir / "index.html", *sorted((run_dir / "notebooks").glob("*.html"))]:
        text = page.read_text()
        assert 'src="http' not in text and 'href="http' not in text, f"{page.name} fetches from the internet"
    failing = (run_dir / "notebooks" / "01_fails.html").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert f'id="{summary["notebooks"][0]["error"]["anchor"]}"' in failing
    assert "broken on purpose" in failing


# --- the index page in a real headless browser --------------------------------------------------------

def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if not shutil.which("apt-get"):
        pytest.skip("chromium is not installed and apt-get is not available to install it")
    if os.geteuid() != 0:
        pytest.skip("chromium is not installed and installing it with apt-get needs root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    start = time.perf_counter()
    install = ["apt-get", "install", "-y", "-q", "chromium"]
    done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(install, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"apt-get could not install chromium: {done.stderr[-500:]}")
    print(f"installed chromium in {time.perf_counter() - start:.0f} s")
    return shutil.which("chromium")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class DevTools:
    """A minimal Chrome DevTools Protocol client over one page's websocket."""

    def __init__(self, ws_url: str):
        import websocket

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 30) -> dict:
        import websocket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(i)
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                self.events.append(json.loads(self.ws.recv()))
            except websocket.WebSocketTimeoutException:
                break
        raise TimeoutError(f"no {method} within {timeout} s")

    def drain(self, seconds: float) -> None:
        import websocket

        self.ws.settimeout(seconds)
        try:
            while True:
                self.events.append(json.loads(self.ws.recv()))
        except websocket.WebSocketTimeoutException:
            pass

    def load(self, url: str) -> list[str]:
        """Navigate, wait for the load event; return the errors seen (console, exceptions, failed loads)."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        self.drain(0.5)
        errors = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                errors.append(f"exception: {params['exceptionDetails'].get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                errors.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
            elif method == "Network.loadingFailed" and not params.get("canceled"):
                errors.append(f"load failed: {params.get('errorText')}")
            elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
                if not params["response"]["url"].endswith("/favicon.ico"):
                    errors.append(f"HTTP {params['response']['status']}: {params['response']['url']}")
        return errors

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


@pytest.fixture
def browser(tmp_path):
    """A headless chromium with remote debugging on a free port, killed (its process group) afterwards."""
    exe = _chromium()
    profile = tmp_path / "chromium-profile"
    proc = subprocess.Popen(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-dev-shm-usage",
         f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
         "--window-size=1400,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, f"chromium exited with {proc.returncode}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port in 60 s"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            page = next(t for t in json.load(r) if t["type"] == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            tools.call(f"{domain}.enable")
        yield tools
        tools.ws.close()
    finally:
        with _suppress():
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with _suppress():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _suppress():
    import contextlib

    return contextlib.suppress(ProcessLookupError, PermissionError)


@pytest.fixture
def served(synthetic_run):  # noqa: F811
    """The synthetic run folder on http://127.0.0.1:<free port>/."""
    handler = lambda *a, **k: _Quiet(*a, directory=str(synthetic_run["run_dir"]), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", synthetic_run["run_dir"]
    server.shutdown()
    server.server_close()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_index_page_in_headless_chromium(browser, served):
    base, run_dir = served
    errors = browser.load(base + "index.html")
    assert errors == [], errors
    assert browser.evaluate("document.title") == f"Gallery run {run_dir.name}"
    rows = browser.evaluate("[...document.querySelectorAll('tbody tr')].map(r => r.innerText)")
    assert len(rows) == 2 and "01_fails" in rows[0] and "failed" in rows[0] and "passed" in rows[1]
    assert "score: 1" in rows[1] and "scale=2.0" in rows[1] and "CPU" in rows[1]

    images = browser.evaluate("[...document.images].map(i => [i.src, i.complete && i.naturalWidth > 0])")
    assert images and all(ok for _, ok in images), images
    links = browser.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.href)")
    assert any("#cell-id=" in link for link in links), "the failed notebook does not link to its failing cell"
    for link in links:
        if link.startswith("data:"):
            continue
        url, _, fragment = link.partition("#")
        assert url.startswith(base), f"{link} leaves the report"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200, link
            body = r.read()
        if fragment:
            assert f'id="{urllib.parse.unquote(fragment)}"'.encode() in body, f"{link}: no such anchor"

    for page in sorted({link.partition("#")[0] for link in links if link.endswith(".html") or "#" in link}):
        assert browser.load(page) == [], page  # the rendered notebooks load cleanly too
    failing = next(link for link in links if "#cell-id=" in link)
    browser.load(failing)
    found = browser.evaluate("(() => { const el = document.getElementById("
                             "decodeURIComponent(location.hash.slice(1)));"
                             " return el ? el.innerText : null; })()")
    assert found and "broken on purpose" in found, "the anchor is not the failing cell"

    browser.load(base + "index.html")
    browser.call("Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1,
                 mobile=False)
    shot = base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"])
    (run_dir / "index-screenshot.png").write_bytes(shot)
    assert _png_size(shot) == (1400, 900) and len(shot) > 20_000, "the screenshot is empty"


def test_report_can_be_rebuilt_from_a_run_folder(synthetic_run, capsys):  # noqa: F811
    run_dir = synthetic_run["run_dir"]
    before = json.loads((run_dir / "summary.json").read_text())
    assert cli.main(["--report", str(run_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(run_dir / "index.html")
    after = json.loads((run_dir / "summary.json").read_text())
    assert [e["html"] for e in after["notebooks"]] == [e["html"] for e in before["notebooks"]]
    assert after["notebooks"][0]["error"]["anchor"] == before["notebooks"][0]["error"]["anchor"]
