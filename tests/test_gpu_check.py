"""The GPU check's logic, on CPU: metric assertions, skip reporting, failure isolation, the report, the bundle
budget. No real notebook runs here: fake notebooks in tmp_path, or a stand-in executor.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.gallery.execute import notebook_parameters

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_check = _load("gpu_check")
gpu_bundle = _load("gpu_bundle")

GPU = gpu_check.expectations("cuda", bf16_supported=True)
CPU = gpu_check.expectations("cpu")
GOOD_GPU = {"device": "cuda", "backend": "nccl", "precision": "bf16", "samples_per_s": 12345.6,
            "peak_gpu_mb": 512.5, "processes": 1}
CPU_METRICS = {"device": "cpu", "backend": "gloo", "precision": "fp32", "samples_per_s": 900.0,
               "peak_gpu_mb": None, "processes": 1}


# ------------------------------------------------------------------------------------ metric assertions

def test_metrics_of_a_cpu_run_fail_the_gpu_expectations():
    problems = gpu_check.check_metrics(CPU_METRICS, GPU, "samples_per_s", processes=1)
    text = "\n".join(problems)
    assert "device is 'cpu', expected 'cuda'" in text
    assert "backend is 'gloo', expected 'nccl'" in text
    assert "precision is 'fp32', expected 'bf16'" in text
    assert "peak_gpu_mb is None" in text


def test_metrics_of_a_gpu_run_pass_and_lightning_precision_names_count():
    assert gpu_check.check_metrics(GOOD_GPU, GPU, "samples_per_s", processes=1) == []
    assert gpu_check.check_metrics(dict(GOOD_GPU, precision="bf16-mixed"), GPU, "samples_per_s") == []
    assert gpu_check.check_metrics(CPU_METRICS, CPU, "samples_per_s", processes=1) == []


@pytest.mark.parametrize("change, expected", [
    ({"precision": "fp32"}, "precision is 'fp32', expected 'bf16'"),   # autocast silently off
    ({"samples_per_s": 0.0}, "throughput samples_per_s is 0.0"),
    ({"samples_per_s": None}, "throughput samples_per_s is None"),
    ({"peak_gpu_mb": 0.0}, "peak_gpu_mb is 0.0"),
    ({"processes": 2}, "processes is 2, expected 1"),
])
def test_each_gpu_expectation_is_checked(change, expected):
    problems = gpu_check.check_metrics(dict(GOOD_GPU, **change), GPU, "samples_per_s", processes=1)
    assert any(expected in p for p in problems), problems


def test_a_gpu_without_bf16_expects_fp16():
    old_gpu = gpu_check.expectations("cuda", bf16_supported=False)
    assert old_gpu.precision == "fp16"
    assert gpu_check.check_metrics(dict(GOOD_GPU, precision="fp16"), old_gpu, "samples_per_s") == []
    assert gpu_check.check_metrics(GOOD_GPU, old_gpu, "samples_per_s") != []


def test_no_metrics_is_a_failure():
    problems = gpu_check.check_metrics({}, GPU, "samples_per_s")
    assert problems == ["recorded no metrics (record_metrics did not run)"]


# ------------------------------------------------------------------ running checks: skips, failures, budget

def _ctx(tmp_path, budget_s=600.0, device="cpu"):
    return gpu_check.Context(device=device, expect=CPU if device == "cpu" else GPU, processes=1,
                             work=tmp_path / "work", env=dict(os.environ), budget_s=budget_s)


def _write_notebook(path: Path, code: str, metrics: dict | None = None) -> Path:
    """A tiny notebook with the shared parameters, running `code`, then recording `metrics` as
    record_metrics does (its output metadata), without importing helpers (and torch) in the kernel."""
    cells = [new_code_cell("processes = 'auto'\nmax_steps = None", metadata={"tags": ["parameters"]}),
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
            return gpu_check.Outcome(1, False, 0.5, "boom")
        nb = new_notebook(cells=[new_code_cell("record_metrics(...)")])
        nb.cells[0].outputs = [nbformat.v4.new_output(
            "display_data", data={"text/plain": ""},
            metadata={"distributed_gallery": {"metrics": metrics or CPU_METRICS}})]
        nbformat.write(nb, str(dst))
        return gpu_check.Outcome(0, False, 1.5, "")
    return execute


def _check(name, **kw):
    kw.setdefault("throughput", "samples_per_s")
    kw.setdefault("limit_s", 60)
    return gpu_check.NotebookCheck(name, **kw)


def test_a_notebook_that_cannot_be_carried_is_skipped_with_its_reason(tmp_path):
    calls = []
    checks = [_check("a_needs_ray", uncarried=("surely_not_a_module_xyz",),
                     uncarried_reason="Ray is too big"), _check("b_fine")]
    results = gpu_check.run_checks(checks, _ctx(tmp_path), _fake_executor(calls))
    assert [r.status for r in results] == ["skipped", "passed"]
    assert results[0].notes == "skipped: Ray is too big (missing: surely_not_a_module_xyz)"
    assert [c[0] for c in calls] == ["b_fine"], "a skipped notebook must not run"
    assert gpu_check.exit_status(results) == gpu_check.EXIT_OK, "a stated skip is not a failure"


def test_a_missing_carried_package_is_a_failure_naming_the_bundle(tmp_path):
    results = gpu_check.run_checks([_check("a", carried=("surely_not_a_module_xyz",))], _ctx(tmp_path),
                                   _fake_executor([]))
    assert results[0].status == "failed" and "gpu-bundle" in results[0].problems[0]
    assert gpu_check.exit_status(results) == gpu_check.EXIT_FAILED


def test_failures_do_not_stop_the_others_and_set_the_exit_status(tmp_path):
    calls = []
    checks = [_check("a_raises"), _check("b_fine"), _check("c_machinery_breaks")]

    def executor(src, dst, parameters, limit_s, env):
        if src.stem == "c_machinery_breaks":
            raise OSError("disk full")
        return _fake_executor(calls, fail={"a_raises"})(src, dst, parameters, limit_s, env)

    results = gpu_check.run_checks(checks, _ctx(tmp_path), executor)
    assert [r.status for r in results] == ["failed", "passed", "failed"]
    assert "RuntimeError: boom" in results[0].problems[0]
    assert "OSError: disk full" in results[2].problems[0]
    assert gpu_check.exit_status(results) == gpu_check.EXIT_FAILED


def test_parameters_are_the_few_step_ones_with_processes_1_and_cpu_overrides(tmp_path):
    calls = []
    check = _check("a", parameters={"max_steps": 3, "preset": "10M"}, cpu_parameters={"preset": "tiny"})
    gpu_check.run_checks([check], _ctx(tmp_path), _fake_executor(calls))
    gpu_check.run_checks([check], _ctx(tmp_path, device="cuda"), _fake_executor(calls, metrics=GOOD_GPU))
    assert calls[0][1] == {"max_steps": 3, "preset": "tiny", "processes": 1}
    assert calls[1][1] == {"max_steps": 3, "preset": "10M", "processes": 1}


def test_the_budget_limits_each_notebook_and_stops_starting_them(tmp_path):
    calls = []
    ctx = _ctx(tmp_path, budget_s=45)
    gpu_check.run_checks([_check("a", limit_s=100), _check("b")], ctx, _fake_executor(calls))
    assert 40 < calls[0][2] <= 45, "the limit is cut to what is left of the budget"
    ctx = _ctx(tmp_path, budget_s=10)
    results = gpu_check.run_checks([_check("a", limit_s=100)], ctx, _fake_executor(calls))
    assert results[0].status == "failed" and results[0].problems[0].startswith("not run:")


def test_time_left_unused_goes_to_the_next_notebook_never_what_later_ones_need():
    assert gpu_check.time_limit(60, 5.0, 1000) == 1000, "alone: the whole budget"
    assert gpu_check.time_limit(60, 1.0, 200, reserve_s=100) == 100, "its own 60 s and 40 s left unused"
    assert gpu_check.time_limit(60, 1.0, 150, reserve_s=100) == 60, "never less than its own"
    assert gpu_check.time_limit(60, 1.0, 50, reserve_s=100) == 50, "never past the budget"
    assert gpu_check.time_limit(60, 1.0, 20) is None, "too little left to start"


def test_later_notebooks_keep_their_limits(tmp_path):
    calls = []
    checks = [_check("a", limit_s=60), _check("b", limit_s=100),
              _check("c_skipped", limit_s=300, uncarried=("surely_not_a_module_xyz",))]
    gpu_check.run_checks(checks, _ctx(tmp_path, budget_s=200), _fake_executor(calls))
    assert 95 < calls[0][2] <= 100, "a: 200 s less b's 100 (c is skipped, so reserves nothing)"
    assert 195 < calls[1][2] <= 200, "b: what a left unused (a fake run takes no time)"


def test_gpu_run_metrics_that_say_cpu_fail_the_check(tmp_path):
    results = gpu_check.run_checks([_check("a")], _ctx(tmp_path, device="cuda"), _fake_executor([]))
    assert results[0].status == "failed"
    assert any("expected 'cuda'" in p for p in results[0].problems)


def test_report_files_hold_the_table_and_the_exit_status(tmp_path):
    results = [gpu_check.Result("01_x", "passed", 12.3, 512.0, 1e4, "samples_per_s",
                                {"device": "cuda", "backend": "nccl", "precision": "bf16"}, "parity on CPU"),
               gpu_check.Result("06_y", "skipped", notes="skipped: no Ray"),
               gpu_check.Result("02_z", "failed", problems=["cell 3 raised\nValueError: x | y"])]
    gpu_check.write_report(tmp_path, results, {"device": "cuda", "versions": {"torch": "2.11.0"}})
    md = (tmp_path / "report.md").read_text()
    assert "| 01_x | passed | 12.3 | cuda / nccl / bf16 | 512.0 | 10,000.0 samples/s | parity on CPU |" in md
    assert "| 06_y | skipped |" in md and "skipped: no Ray" in md
    assert "cell 3 raised ValueError: x / y" in md, "a problem stays on one table line"
    assert "| torch | 2.11.0 |" in md
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_status"] == gpu_check.EXIT_FAILED and len(report["results"]) == 3


def test_main_writes_the_report_and_returns_the_exit_status(tmp_path):
    checks = (_check("01_ok"), _check("02_bad"), _check("06_ray", uncarried=("surely_not_a_module_xyz",),
                                                         uncarried_reason="no Ray"))
    status = gpu_check.main(["--device", "cpu", "--no-install", "--out", str(tmp_path / "out")],
                            checks=checks, executor=_fake_executor([], fail={"02_bad"}))
    assert status == gpu_check.EXIT_FAILED
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["status"] for r in report["results"]] == ["passed", "failed", "skipped"]
    assert report["versions"]["torch"] and report["expect"] == {"device": "cpu", "backend": "gloo",
                                                                 "precision": "fp32"}


def test_no_gpu_fails_the_preflight_before_anything_runs(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    calls = []
    status = gpu_check.main(["--no-install", "--out", str(tmp_path)], checks=(_check("01_x"),),
                            executor=_fake_executor(calls))
    assert status == gpu_check.EXIT_PREFLIGHT and calls == []
    assert "torch.cuda.is_available() is False" in (tmp_path / "report.md").read_text()


# ----------------------------------------------------------------- real papermill runs of fake notebooks

def test_fake_notebooks_run_with_papermill_a_raising_one_fails_and_the_next_passes(tmp_path):
    ok = dict(CPU_METRICS, processes=1)
    raising = _write_notebook(tmp_path / "a_raises.ipynb", "x = 1\nraise ValueError('boom in the notebook')")
    fine = _write_notebook(tmp_path / "b_fine.ipynb", "assert processes == 1, processes", metrics=ok)
    checks = [_check("a_raises", source=raising), _check("b_fine", source=fine)]
    ctx = _ctx(tmp_path)
    ctx.env = gpu_check.child_env("cpu", None, gpu_check.write_kernelspec(tmp_path / "jupyter"))
    results = gpu_check.run_checks(checks, ctx)
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
    monkeypatch.setattr(gpu_check.subprocess, "Popen",
                        lambda cmd, **kw: real_popen([sys.executable, "-c", script], **kw))
    start = time.monotonic()
    outcome = gpu_check.subprocess_executor(tmp_path / "x.ipynb", tmp_path / "out" / "x.ipynb", {}, 3,
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


# ------------------------------------------------------------------------ the notebooks' check settings

@pytest.mark.parametrize("check", gpu_check.CHECKS, ids=lambda c: c.name)
def test_each_notebooks_check_uses_parameters_it_declares_and_a_metric_it_records(check):
    declared = notebook_parameters(check.path)
    assert set(check.parameters) | set(check.cpu_parameters) | {"processes"} <= set(declared)
    assert f"{check.throughput}=" in check.path.read_text(), f"{check.name} records no {check.throughput}"


def test_the_limits_fit_one_device_call():
    from tests.support import training_notebooks

    # the launcher's tour trains nothing: its code is the launcher's, which the others' GPU runs exercise
    notebooks = {p.stem for p in training_notebooks()}
    assert {c.name for c in gpu_check.CHECKS} == notebooks, "every notebook that trains has its check"
    runnable = sum(c.limit_s for c in gpu_check.CHECKS if not c.uncarried)
    assert runnable + 20 <= gpu_check.DEFAULT_BUDGET_S <= 580, "10 minutes, install and start included"


# --------------------------------------------------------------------------------------------- the bundle

def test_an_oversize_bundle_is_refused(tmp_path):
    (tmp_path / "big-1.0-py3-none-any.whl").write_bytes(b"")
    os.truncate(tmp_path / "big-1.0-py3-none-any.whl", 49 * gpu_bundle.MIB)   # sparse: no disk used
    with pytest.raises(gpu_bundle.BundleError, match=r"49\.0 MiB, over its budget of 48\.0 MiB.*big-1\.0"):
        gpu_bundle.check_budget(tmp_path, 48 * gpu_bundle.MIB)
    assert gpu_bundle.check_budget(tmp_path, 50 * gpu_bundle.MIB) == 49 * gpu_bundle.MIB
    with pytest.raises(gpu_bundle.BundleError, match="over the 64 MiB a transfer carries.*--transfer-mib"):
        gpu_bundle.check_budget(tmp_path, 50 * gpu_bundle.MIB, tree=16 * gpu_bundle.MIB)
    # a machine that takes more: the limit is an option
    assert gpu_bundle.check_budget(tmp_path, 50 * gpu_bundle.MIB, tree=16 * gpu_bundle.MIB,
                                   limit=128 * gpu_bundle.MIB) == 49 * gpu_bundle.MIB


def test_the_bundle_list_refuses_duplicates_and_what_the_machine_has():
    assert gpu_bundle.check_list() is None
    with pytest.raises(gpu_bundle.BundleError, match="listed twice"):
        gpu_bundle.check_list((gpu_bundle.Wheel("trl", "1", ""), gpu_bundle.Wheel("TRL", "2", "")))
    with pytest.raises(gpu_bundle.BundleError, match="on the GPU machine already"):
        gpu_bundle.check_list((gpu_bundle.Wheel("torch", "2.14.1", ""),))
    carried = {gpu_bundle.normalize(w.name) for w in gpu_bundle.BUNDLE}
    assert not carried & set(gpu_bundle.NOT_CARRIED), "ray/mlflow are reported skipped, not carried"


@pytest.mark.parametrize("filename, fits", [
    ("multiprocess-0.70.15-py311-none-any.whl", False),   # 3.11's code under a 3.12 interpreter
    ("multiprocess-0.70.16-py312-none-any.whl", True),
    ("tornado-6.6.1-cp311-abi3-manylinux1_x86_64.whl", True),
    ("rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.whl", True),
    ("x-1-cp311-cp311-manylinux_2_17_x86_64.whl", False),
    ("debugpy-1.8.22-py2.py3-none-any.whl", True),
])
def test_wheels_must_fit_the_machines_python(filename, fits):
    assert gpu_bundle.runs_on_device_python(filename) is fits


def _tiny_wheel(folder: Path, name: str, version: str = "1.0") -> Path:
    """A minimal pure-Python wheel of one module `name` (what pip needs: the module, METADATA, WHEEL,
    RECORD)."""
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": b"VALUE = 42\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}

    def digest(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(data)},{len(data)}\n" for path, data in files.items())
    record += f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for rel, data in files.items():
            zf.writestr(rel, data)
        zf.writestr(f"{dist}/RECORD", record)
    return path


def test_the_bundle_installs_only_what_this_python_lacks(tmp_path, monkeypatch):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    wheel = _tiny_wheel(bundle, "gpu_check_probe_pkg")
    manifest = {"wheels": [{"name": "gpu_check_probe_pkg", "version": "1.0", "file": wheel.name},
                           {"name": "pytest", "version": "0", "file": "pytest-0-py3-none-any.whl"}]}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(sys, "path", list(sys.path))
    info = gpu_check.install_bundle(bundle, tmp_path / "site")
    assert "error" not in info, info.get("error")
    assert info["installed"] == ["gpu_check_probe_pkg==1.0"]
    assert "pytest" in info["already_present"], "a package this Python has is not installed over it"
    assert (tmp_path / "site" / "gpu_check_probe_pkg.py").is_file()
    assert importlib.util.find_spec("gpu_check_probe_pkg") is not None
    env = gpu_check.child_env("cuda", tmp_path / "site", tmp_path / "jupyter")
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(tmp_path / "site"), str(ROOT)]
    assert env["GALLERY_TRACKING"] == "off"
    assert env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES"), "cuda: GPUs untouched"
    assert gpu_check.child_env("cpu", None, tmp_path)["CUDA_VISIBLE_DEVICES"] == "", "cpu: no GPU visible"


def test_a_missing_bundle_says_how_to_make_one(tmp_path):
    info = gpu_check.install_bundle(tmp_path / "nothing", tmp_path / "site")
    assert "make gpu-bundle" in info["error"]


def test_the_gpu_check_uses_the_real_package():
    """No stand-in `helpers` module and no second idea of where the checkout is: the tool's places are
    helpers.paths', and its child process imports the package itself (which imports no torch)."""
    import helpers.paths

    source = (ROOT / "tools" / "gpu_check.py").read_text()
    assert "ModuleType" not in source and 'sys.modules["helpers"]' not in source
    assert gpu_check.ROOT is helpers.paths.ROOT and gpu_check.NOTEBOOKS_DIR is helpers.paths.NOTEBOOKS_DIR
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import helpers.gallery.execute"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    imported = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    assert "torch" not in imported, "the GPU check's notebook runner imports torch"


# ------------------------------------------------------------------------------------ the published page

def _report(date: str, rows: list[dict], device: str = "cuda") -> dict:
    return {"date": date, "device": device, "gpu": {"name": "NVIDIA H200", "torch": "2.11.0+cu130"},
            "versions": {"torch": "2.11.0"}, "results": rows}


def test_the_published_page_is_rebuilt_from_its_kept_reports():
    """docs/gpu-check.md is what --publish writes from docs/gpu-check/*.json: a hand edit or a report added
    without re-publishing fails here."""
    kept = sorted(gpu_check.PUBLISHED_REPORTS.glob("*.json"))
    assert kept, "docs/gpu-check/ holds no report"
    reports = [json.loads(p.read_text()) for p in kept]
    assert gpu_check.PUBLISHED_PAGE.read_text() == gpu_check.published_page(reports), \
        "docs/gpu-check.md is stale: python tools/gpu_check.py --publish docs/gpu-check/*.json"
    assert all(r["device"] == "cuda" for r in reports)


def test_the_newest_result_of_each_notebook_is_published():
    older = _report("a", [{"notebook": "03_x", "status": "failed", "problems": ["boom"]},
                          {"notebook": "01_y", "status": "passed", "seconds": 5.0}])
    newer = _report("b", [{"notebook": "03_x", "status": "passed", "seconds": 7.0}])
    page = gpu_check.published_page([older, newer])
    assert "| 03_x | passed | 7.0 |" in page and "boom" not in page
    assert "| 01_y | passed | 5.0 |" in page
    assert "| 03_x | failed" in gpu_check.published_page([newer, older]), "the later report must win"


def test_a_cpu_report_or_none_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    page = tmp_path / "gpu-check.md"
    page.write_text("kept\n")
    cpu = tmp_path / "report.json"
    cpu.write_text(json.dumps(_report("c", [{"notebook": "01_y", "status": "passed"}], device="cpu")))
    with pytest.raises(ValueError, match="not a GPU result"):
        gpu_check.publish(page, [cpu])
    with pytest.raises(FileNotFoundError, match="make gpu-check"):
        gpu_check.publish(page, [tmp_path / "absent.json"])
    assert page.read_text() == "kept\n" and not (tmp_path / "gpu-check").exists()
