"""The GPU check's logic, on CPU: metric assertions, skip reporting, failure isolation, the report, the
budget, and the command line as the docs give it. No real notebook runs here: fake notebooks in tmp_path, or a
stand-in executor. The bundle and the published page have their own files (tests/test_gpu_check_*.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.gallery.execute import notebook_parameters
from tools.gpu_check.checks import CHECKS, NotebookCheck
from tools.gpu_check.cli import main
from tools.gpu_check.environment import child_env, write_kernelspec
from tools.gpu_check.executor import Outcome, subprocess_executor
from tools.gpu_check.metrics import check_metrics, expectations
from tools.gpu_check.report import write_report
from tools.gpu_check.runner import (
    DEFAULT_BUDGET_S,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREFLIGHT,
    Context,
    Result,
    exit_status,
    run_checks,
    time_limit,
)

ROOT = Path(__file__).resolve().parent.parent

GPU = expectations("cuda", bf16_supported=True)
CPU = expectations("cpu")
GOOD_GPU = {"device": "cuda", "backend": "nccl", "precision": "bf16", "samples_per_s": 12345.6,
            "peak_gpu_mb": 512.5, "processes": 1}
CPU_METRICS = {"device": "cpu", "backend": "gloo", "precision": "fp32", "samples_per_s": 900.0,
               "peak_gpu_mb": None, "processes": 1}


# ------------------------------------------------------------------------------------ metric assertions

def test_metrics_of_a_cpu_run_fail_the_gpu_expectations():
    problems = check_metrics(CPU_METRICS, GPU, "samples_per_s", processes=1)
    text = "\n".join(problems)
    assert "device is 'cpu', expected 'cuda'" in text
    assert "backend is 'gloo', expected 'nccl'" in text
    assert "precision is 'fp32', expected 'bf16'" in text
    assert "peak_gpu_mb is None" in text


def test_metrics_of_a_gpu_run_pass_and_lightning_precision_names_count():
    assert check_metrics(GOOD_GPU, GPU, "samples_per_s", processes=1) == []
    assert check_metrics(dict(GOOD_GPU, precision="bf16-mixed"), GPU, "samples_per_s") == []
    assert check_metrics(CPU_METRICS, CPU, "samples_per_s", processes=1) == []


@pytest.mark.parametrize("change, expected", [
    ({"precision": "fp32"}, "precision is 'fp32', expected 'bf16'"),   # autocast silently off
    ({"samples_per_s": 0.0}, "throughput samples_per_s is 0.0"),
    ({"samples_per_s": None}, "throughput samples_per_s is None"),
    ({"peak_gpu_mb": 0.0}, "peak_gpu_mb is 0.0"),
    ({"processes": 2}, "processes is 2, expected 1"),
])
def test_each_gpu_expectation_is_checked(change, expected):
    problems = check_metrics(dict(GOOD_GPU, **change), GPU, "samples_per_s", processes=1)
    assert any(expected in p for p in problems), problems


def test_a_gpu_without_bf16_expects_fp16():
    old_gpu = expectations("cuda", bf16_supported=False)
    assert old_gpu.precision == "fp16"
    assert check_metrics(dict(GOOD_GPU, precision="fp16"), old_gpu, "samples_per_s") == []
    assert check_metrics(GOOD_GPU, old_gpu, "samples_per_s") != []


def test_no_metrics_is_a_failure():
    problems = check_metrics({}, GPU, "samples_per_s")
    assert problems == ["recorded no metrics (record_metrics did not run)"]


# ------------------------------------------------------------------ running checks: skips, failures, budget

def _ctx(tmp_path, budget_s=600.0, device="cpu"):
    return Context(device=device, expect=CPU if device == "cpu" else GPU, processes=1,
                   work=tmp_path / "work", env=dict(os.environ), budget_s=budget_s)


def _write_notebook(path: Path, code: str, metrics: dict | None = None, parameters: str = "") -> Path:
    """A tiny notebook with the shared parameters (and `parameters`), running `code`, then recording `metrics`
    as record_metrics does (its output metadata), without importing helpers (and torch) in the kernel."""
    cells = [new_code_cell(f"processes = 'auto'\nmax_steps = None\n{parameters}",
                           metadata={"tags": ["parameters"]}),
             new_code_cell(code)]
    if metrics is not None:
        cells.append(new_code_cell(
            "from IPython.display import display\n"
            f"display({{'text/plain': ''}}, raw=True,\n"
            f"        metadata={{'distributed_gallery': {{'metrics': {metrics!r}}}}})"))
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def _fake_executor(calls, fail=(), metrics=None):
    """Stands in for papermill: writes an executed notebook that recorded `metrics`, or one that raised."""
    def execute(src, dst, parameters, limit_s, env):
        calls.append((src.stem, parameters, limit_s))
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.stem in fail:
            _write_notebook(dst, "raise RuntimeError('boom')")
            nb = nbformat.read(str(dst), as_version=4)
            nb.cells[1].outputs = [nbformat.v4.new_output("error", ename="RuntimeError", evalue="boom",
                                                          traceback=[])]
            nbformat.write(nb, str(dst))
            return Outcome(1, False, 0.5, "boom")
        nb = new_notebook(cells=[new_code_cell("record_metrics(...)")])
        nb.cells[0].outputs = [nbformat.v4.new_output(
            "display_data", data={"text/plain": ""},
            metadata={"distributed_gallery": {"metrics": metrics or CPU_METRICS}})]
        nbformat.write(nb, str(dst))
        return Outcome(0, False, 1.5, "")
    return execute


def _check(name, **kw):
    kw.setdefault("throughput", "samples_per_s")
    kw.setdefault("limit_s", 60)
    return NotebookCheck(name, **kw)


def test_a_notebook_that_cannot_be_carried_is_skipped_with_its_reason(tmp_path):
    calls = []
    checks = [_check("a_needs_ray", uncarried=("surely_not_a_module_xyz",),
                     uncarried_reason="Ray is too big"), _check("b_fine")]
    results = run_checks(checks, _ctx(tmp_path), _fake_executor(calls))
    assert [r.status for r in results] == ["skipped", "passed"]
    assert results[0].notes == "skipped: Ray is too big (missing: surely_not_a_module_xyz)"
    assert [c[0] for c in calls] == ["b_fine"], "a skipped notebook must not run"
    assert exit_status(results) == EXIT_OK, "a stated skip is not a failure"


def test_a_missing_carried_package_is_a_failure_naming_the_bundle(tmp_path):
    results = run_checks([_check("a", carried=("surely_not_a_module_xyz",))], _ctx(tmp_path),
                         _fake_executor([]))
    assert results[0].status == "failed" and "gpu-bundle" in results[0].problems[0]
    assert exit_status(results) == EXIT_FAILED


def test_failures_do_not_stop_the_others_and_set_the_exit_status(tmp_path):
    calls = []
    checks = [_check("a_raises"), _check("b_fine"), _check("c_machinery_breaks")]

    def executor(src, dst, parameters, limit_s, env):
        if src.stem == "c_machinery_breaks":
            raise OSError("disk full")
        return _fake_executor(calls, fail={"a_raises"})(src, dst, parameters, limit_s, env)

    results = run_checks(checks, _ctx(tmp_path), executor)
    assert [r.status for r in results] == ["failed", "passed", "failed"]
    assert "RuntimeError: boom" in results[0].problems[0]
    assert "OSError: disk full" in results[2].problems[0]
    assert exit_status(results) == EXIT_FAILED


def test_parameters_are_the_few_step_ones_with_processes_1_and_cpu_overrides(tmp_path):
    calls = []
    check = _check("a", parameters={"max_steps": 3, "preset": "10M"}, cpu_parameters={"preset": "tiny"})
    run_checks([check], _ctx(tmp_path), _fake_executor(calls))
    run_checks([check], _ctx(tmp_path, device="cuda"), _fake_executor(calls, metrics=GOOD_GPU))
    assert calls[0][1] == {"max_steps": 3, "preset": "tiny", "processes": 1}
    assert calls[1][1] == {"max_steps": 3, "preset": "10M", "processes": 1}


def test_the_budget_limits_each_notebook_and_stops_starting_them(tmp_path):
    calls = []
    ctx = _ctx(tmp_path, budget_s=45)
    run_checks([_check("a", limit_s=100), _check("b")], ctx, _fake_executor(calls))
    assert 40 < calls[0][2] <= 45, "the limit is cut to what is left of the budget"
    ctx = _ctx(tmp_path, budget_s=10)
    results = run_checks([_check("a", limit_s=100)], ctx, _fake_executor(calls))
    assert results[0].status == "failed" and results[0].problems[0].startswith("not run:")


def test_time_left_unused_goes_to_the_next_notebook_never_what_later_ones_need():
    assert time_limit(60, 5.0, 1000) == 1000, "alone: the whole budget"
    assert time_limit(60, 1.0, 200, reserve_s=100) == 100, "its own 60 s and 40 s left unused"
    assert time_limit(60, 1.0, 150, reserve_s=100) == 60, "never less than its own"
    assert time_limit(60, 1.0, 50, reserve_s=100) == 50, "never past the budget"
    assert time_limit(60, 1.0, 20) is None, "too little left to start"


def test_later_notebooks_keep_their_limits(tmp_path):
    calls = []
    checks = [_check("a", limit_s=60), _check("b", limit_s=100),
              _check("c_skipped", limit_s=300, uncarried=("surely_not_a_module_xyz",))]
    run_checks(checks, _ctx(tmp_path, budget_s=200), _fake_executor(calls))
    assert 95 < calls[0][2] <= 100, "a: 200 s less b's 100 (c is skipped, so reserves nothing)"
    assert 195 < calls[1][2] <= 200, "b: what a left unused (a fake run takes no time)"


def test_gpu_run_metrics_that_say_cpu_fail_the_check(tmp_path):
    results = run_checks([_check("a")], _ctx(tmp_path, device="cuda"), _fake_executor([]))
    assert results[0].status == "failed"
    assert any("expected 'cuda'" in p for p in results[0].problems)


def test_report_files_hold_the_table_and_the_exit_status(tmp_path):
    results = [Result("01_x", "passed", 12.3, 512.0, 1e4, "samples_per_s",
                      {"device": "cuda", "backend": "nccl", "precision": "bf16"}, "parity on CPU"),
               Result("06_y", "skipped", notes="skipped: no Ray"),
               Result("02_z", "failed", problems=["cell 3 raised\nValueError: x | y"])]
    write_report(tmp_path, results, {"device": "cuda", "versions": {"torch": "2.11.0"}})
    md = (tmp_path / "report.md").read_text()
    assert "| 01_x | passed | 12.3 | cuda / nccl / bf16 | 512.0 | 10,000.0 samples/s | parity on CPU |" in md
    assert "| 06_y | skipped |" in md and "skipped: no Ray" in md
    assert "cell 3 raised ValueError: x / y" in md, "a problem stays on one table line"
    assert "| torch | 2.11.0 |" in md
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_status"] == EXIT_FAILED and len(report["results"]) == 3


def test_main_writes_the_report_and_returns_the_exit_status(tmp_path):
    checks = (_check("01_ok"), _check("02_bad"), _check("06_ray", uncarried=("surely_not_a_module_xyz",),
                                                         uncarried_reason="no Ray"))
    status = main(["--device", "cpu", "--no-install", "--out", str(tmp_path / "out")],
                  checks=checks, executor=_fake_executor([], fail={"02_bad"}))
    assert status == EXIT_FAILED
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["status"] for r in report["results"]] == ["passed", "failed", "skipped"]
    assert report["versions"]["torch"] and report["expect"] == {"device": "cpu", "backend": "gloo",
                                                                 "precision": "fp32"}


def test_no_gpu_fails_the_preflight_before_anything_runs(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    calls = []
    status = main(["--no-install", "--out", str(tmp_path)], checks=(_check("01_x"),),
                  executor=_fake_executor(calls))
    assert status == EXIT_PREFLIGHT and calls == []
    assert "torch.cuda.is_available() is False" in (tmp_path / "report.md").read_text()


# ----------------------------------------------------------------- real papermill runs of fake notebooks

def test_fake_notebooks_run_with_papermill_a_raising_one_fails_and_the_next_passes(tmp_path):
    ok = dict(CPU_METRICS, processes=1)
    raising = _write_notebook(tmp_path / "a_raises.ipynb", "x = 1\nraise ValueError('boom in the notebook')")
    fine = _write_notebook(tmp_path / "b_fine.ipynb", "assert processes == 1, processes", metrics=ok)
    checks = [_check("a_raises", source=raising), _check("b_fine", source=fine)]
    ctx = _ctx(tmp_path)
    ctx.env = child_env("cpu", None, write_kernelspec(tmp_path / "jupyter"))
    results = run_checks(checks, ctx)
    assert [r.status for r in results] == ["failed", "passed"], [r.problems for r in results]
    assert "cell 1 (x = 1) raised ValueError: boom in the notebook" in results[0].problems[0]
    assert results[1].throughput == 900.0 and results[1].seen["device"] == "cpu"


def test_a_notebook_past_its_limit_is_killed_with_everything_it_started(tmp_path, monkeypatch):
    """The executor's kill reaches processes in their own session, as papermill's kernel is."""
    marker = tmp_path / "grandchild.pid"
    script = (f"import subprocess, sys, time\n"
              f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
              f"start_new_session=True)\n"
              f"open({str(marker)!r}, 'w').write(str(p.pid))\ntime.sleep(120)\n")
    real_popen = subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen",
                        lambda cmd, **kw: real_popen([sys.executable, "-c", script], **kw))
    start = time.monotonic()
    outcome = subprocess_executor(tmp_path / "x.ipynb", tmp_path / "out" / "x.ipynb", {}, 3,
                                  dict(os.environ))
    assert outcome.timed_out and time.monotonic() - start < 30
    grandchild = int(marker.read_text())
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, 9)
        pytest.fail("the process started in its own session outlived the timeout")


def test_the_command_the_docs_give_runs_a_notebook_where_helpers_is_not_installed(tmp_path):
    """`python tools/gpu_check ...` from another folder, with this Python's packages but not its site (so no
    installed helpers): the check finds this checkout's helpers, runs a stand-in for notebook 01 through its
    child process and papermill, and prints the table and the verdict."""
    check = next(c for c in CHECKS if c.name.startswith("01_"))
    declared = "\n".join(f"{k} = {v!r}" for k, v in check.parameters.items())
    (tmp_path / "notebooks").mkdir()
    _write_notebook(tmp_path / "notebooks" / f"{check.name}.ipynb", "assert processes == 1, processes",
                    metrics={**CPU_METRICS, check.throughput: 900.0}, parameters=declared)
    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"], CUDA_VISIBLE_DEVICES="")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-S", str(ROOT / "tools" / "gpu_check"), "--device", "cpu",
                           "--no-install", "--only", "01", "--notebooks", str(tmp_path / "notebooks"),
                           "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == EXIT_OK, proc.stdout + proc.stderr
    assert f"| {check.name} | passed |" in proc.stdout and "cpu / gloo / fp32" in proc.stdout
    assert "gpu_check: all passed (1 passed, 0 skipped, 0 failed)" in proc.stdout
    assert f"report: {out}/report.md" in proc.stdout
    assert json.loads((out / "report.json").read_text())["results"][0]["status"] == "passed"
    assert (out / "notebooks.tar.gz").is_file()


# ------------------------------------------------------------------------ the notebooks' check settings

@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_each_notebooks_check_uses_parameters_it_declares_and_a_metric_it_records(check):
    declared = notebook_parameters(check.path)
    assert set(check.parameters) | set(check.cpu_parameters) | {"processes"} <= set(declared)
    assert f"{check.throughput}=" in check.path.read_text(), f"{check.name} records no {check.throughput}"


def test_the_limits_fit_one_device_call():
    from tests.support import training_notebooks

    # the launcher's tour trains nothing: its code is the launcher's, which the others' GPU runs exercise
    notebooks = {p.stem for p in training_notebooks()}
    assert {c.name for c in CHECKS} == notebooks, "every notebook that trains has its check"
    runnable = sum(c.limit_s for c in CHECKS if not c.uncarried)
    assert runnable + 20 <= DEFAULT_BUDGET_S <= 580, "10 minutes, install and start included"
