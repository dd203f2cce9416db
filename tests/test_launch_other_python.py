"""The launch option `python=`: ranks that run with another environment's interpreter (notebook 09's Axolotl).

The other environment here is a bare venv made in the test's folder, which reaches this environment's packages
(torch, cloudpickle) through a .pth file, as an environment with its own copies would have them, and holds one
module of its own. The ranks must run its interpreter, import its module, see it as their VIRTUAL_ENV, and
still find this checkout's helpers; a bad interpreter is refused before any process starts.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import LaunchError, LaunchOptions, distributed
from helpers.launch import check_options


@pytest.fixture(scope="module")
def other_python(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("other-env")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    found = subprocess.run([str(python), "-c", ask], check=True, capture_output=True, text=True)
    purelib = Path(found.stdout.strip())
    (purelib / "caller_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (purelib / "only_in_the_other_env.py").write_text("WHERE = 'other'\n")
    return python


def test_ranks_run_the_other_interpreter_with_its_own_packages(other_python):
    @distributed(processes=2, python=str(other_python))
    def where():
        import os
        import sys

        import only_in_the_other_env
        import torch.distributed as dist

        import helpers

        dist.init_process_group("gloo")
        total = __import__("torch").ones(1)
        dist.all_reduce(total)
        own = next(i for i, p in enumerate(sys.path) if p.startswith(sys.prefix))
        return {"prefix": sys.prefix, "venv": os.environ["VIRTUAL_ENV"],
                "marker": only_in_the_other_env.WHERE, "helpers": helpers.__file__, "sum": total.item(),
                "own_first": own, "path": sys.path,
                "on_path": os.environ["PATH"].split(os.pathsep)[0]}

    results = where.distributed()
    venv = str(other_python.parent.parent)
    for r in results:
        assert r["prefix"] == venv and r["venv"] == venv and r["marker"] == "other" and r["sum"] == 2.0
        assert r["helpers"] == str(Path(__file__).resolve().parents[1] / "helpers" / "__init__.py")
        assert r["on_path"] == str(other_python.parent)
        caller = sysconfig.get_paths()["purelib"]
        assert caller not in r["path"][:r["own_first"]], "the caller's packages came before the rank's own"


def test_a_rank_error_in_the_other_environment_comes_back_with_its_type(other_python):
    @distributed(processes=2, python=str(other_python))
    def fail():
        raise KeyError("raised in the other environment")

    with pytest.raises(KeyError) as info:
        fail.distributed()
    assert "raised in the other environment" in str(info.value) and "remote traceback" in str(info.value)


def test_a_bad_interpreter_is_refused_before_any_process(tmp_path):
    with pytest.raises(LaunchError, match="is not an executable file: build that environment first"):
        check_options(LaunchOptions(python=str(tmp_path / "bin" / "python")))
    with pytest.raises(LaunchError, match="is for launches on this machine"):
        check_options(LaunchOptions(python=sys.executable, cluster="ray"))
    with pytest.raises(LaunchError, match="pass the path of another environment's interpreter"):
        check_options(LaunchOptions(python=""))
