"""docs/gpu-check.md: rebuilt from its kept reports, each notebook's newest result, skips with the reason the
check gives now, and no CPU report published.
"""

from __future__ import annotations

import json

import pytest

from tools.gpu_check.checks import CHECKS
from tools.gpu_check.publish import PUBLISHED_PAGE, PUBLISHED_REPORTS, publish, published_page

# ------------------------------------------------------------------------------------ the published page

def _report(date: str, rows: list[dict], device: str = "cuda") -> dict:
    return {"date": date, "device": device, "gpu": {"name": "NVIDIA H200", "torch": "2.11.0+cu130"},
            "versions": {"torch": "2.11.0"}, "results": rows}


def test_the_published_page_is_rebuilt_from_its_kept_reports():
    """docs/gpu-check.md is what --publish writes from docs/gpu-check/*.json: a hand edit or a report added
    without re-publishing fails here."""
    kept = sorted(PUBLISHED_REPORTS.glob("*.json"))
    assert kept, "docs/gpu-check/ holds no report"
    reports = [json.loads(p.read_text()) for p in kept]
    assert PUBLISHED_PAGE.read_text() == published_page(reports), \
        "docs/gpu-check.md is stale: python tools/gpu_check --publish docs/gpu-check/*.json"
    assert all(r["device"] == "cuda" for r in reports)


def test_the_newest_result_of_each_notebook_is_published():
    older = _report("a", [{"notebook": "03_x", "status": "failed", "problems": ["boom"]},
                          {"notebook": "01_y", "status": "passed", "seconds": 5.0}])
    newer = _report("b", [{"notebook": "03_x", "status": "passed", "seconds": 7.0}])
    page = published_page([older, newer])
    assert "| 03_x | passed | 7.0 |" in page and "boom" not in page
    assert "| 01_y | passed | 5.0 |" in page
    assert "| 03_x | failed" in published_page([newer, older]), "the later report must win"


def test_a_skip_is_published_with_the_reason_the_check_gives_now():
    old = _report("a", [{"notebook": "06_ray_train_resnet", "status": "skipped",
                         "notes": "skipped: an explanation the code no longer gives (missing: ray)"}])
    page = published_page([old])
    reason = next(c.uncarried_reason for c in CHECKS if c.name == "06_ray_train_resnet")
    assert f"skipped: {reason} (missing: ray)" in page and "no longer gives" not in page


def test_a_cpu_report_or_none_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    page = tmp_path / "gpu-check.md"
    page.write_text("kept\n")
    cpu = tmp_path / "report.json"
    cpu.write_text(json.dumps(_report("c", [{"notebook": "01_y", "status": "passed"}], device="cpu")))
    with pytest.raises(ValueError, match="not a GPU result"):
        publish(page, [cpu])
    with pytest.raises(FileNotFoundError, match="make gpu-check"):
        publish(page, [tmp_path / "absent.json"])
    assert page.read_text() == "kept\n" and not (tmp_path / "gpu-check").exists()
