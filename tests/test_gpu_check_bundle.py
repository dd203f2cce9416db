"""The GPU bundle on CPU: its size budget, its list, the wheels that fit the machine's Python, installing only
what this Python lacks, and the check importing the real helpers package.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools import gpu_bundle
from tools.gpu_check import checks, environment
from tools.gpu_check.bundle import install_bundle
from tools.gpu_check.environment import child_env

ROOT = Path(__file__).resolve().parent.parent


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
    info = install_bundle(bundle, tmp_path / "site")
    assert "error" not in info, info.get("error")
    assert info["installed"] == ["gpu_check_probe_pkg==1.0"]
    assert "pytest" in info["already_present"], "a package this Python has is not installed over it"
    assert (tmp_path / "site" / "gpu_check_probe_pkg.py").is_file()
    assert importlib.util.find_spec("gpu_check_probe_pkg") is not None
    env = child_env("cuda", tmp_path / "site", tmp_path / "jupyter")
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(tmp_path / "site"), str(ROOT)]
    assert env["GALLERY_TRACKING"] == "off"
    assert env.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES"), "cuda: GPUs untouched"
    assert child_env("cpu", None, tmp_path)["CUDA_VISIBLE_DEVICES"] == "", "cpu: no GPU visible"


def test_a_missing_bundle_says_how_to_make_one(tmp_path):
    info = install_bundle(tmp_path / "nothing", tmp_path / "site")
    assert "make gpu-bundle" in info["error"]


def test_the_gpu_check_uses_the_real_package():
    """No stand-in `helpers` module and no second idea of where the checkout is: the tool's places are
    helpers.paths', and its child process imports the package itself (which imports no torch)."""
    import helpers.paths

    source = "".join(p.read_text() for p in (ROOT / "tools" / "gpu_check").glob("*.py"))
    assert "ModuleType" not in source and 'sys.modules["helpers"]' not in source
    assert environment.ROOT is helpers.paths.ROOT and checks.NOTEBOOKS_DIR is helpers.paths.NOTEBOOKS_DIR
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import helpers.gallery.execute"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    imported = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    assert "torch" not in imported, "the GPU check's notebook runner imports torch"
