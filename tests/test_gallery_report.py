"""The gallery report: rendering, index.html in a real headless browser, and --compare.

The browser test drives a headless chromium over the DevTools protocol (tests/browser.py), on the synthetic
gallery run of tests/test_gallery_runner.py served by a local http.server.
"""

from __future__ import annotations

import base64
import json
import struct
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from helpers.gallery import __main__ as cli
from helpers.gallery import compare
from helpers.gallery.errors import USAGE_ERROR, GalleryError
from tests.browser import serve

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

@pytest.fixture
def served(synthetic_run):  # noqa: F811
    """The synthetic run folder on http://127.0.0.1:<free port>/."""
    with serve(synthetic_run["run_dir"]) as base:
        yield base, synthetic_run["run_dir"]


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
