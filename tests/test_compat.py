"""Every private torch, Ray or standard-library API the launchers use still exists where it was.

Each entry of helpers.launch._compat.PRIVATE_APIS is resolved against the installed versions; a failure
names the entry and the version it was checked against. Ray's entries are skipped where Ray is missing
(the GPU machine has none).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

from helpers.launch import _compat
from tests.plugins import nbval_variants, xdist_scopes

LAUNCH = Path(_compat.__file__).parent


@pytest.mark.parametrize("api", _compat.PRIVATE_APIS, ids=lambda api: f"{api.library}:{api.name}")
def test_private_api_is_where_it_was_checked(api):
    if api.library == "ray" and importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed here")
    assert _compat.resolve(api) is not None


@pytest.mark.parametrize("module, name", [*xdist_scopes.PRIVATE_API, *nbval_variants.PRIVATE_API])
def test_test_plugins_private_api_is_where_it_was_checked(module, name):
    """tests/plugins lean on pytest-xdist's and nbval's internals; each plugin's docstring says what breaks.
    """
    value = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    assert value is not None


def test_nbval_collector_still_has_a_kernel_attribute():
    """nbval_variants knows a kernel is about to start from `IPyNbFile.kernel` being None."""
    import inspect

    from nbval.plugin import IPyNbFile

    assert "self.kernel" in inspect.getsource(IPyNbFile)


def test_a_moved_name_fails_loudly_naming_the_checked_version():
    moved = _compat.PrivateAPI("torch", "torch.distributed.rendezvous", "_handlers_renamed", "2.14.1")
    with pytest.raises(_compat.CompatError, match=r"_handlers_renamed moved.*checked against torch 2\.14\.1.*"
                                                  r"Update its entry in helpers/launch/_compat\.py"):
        _compat.resolve(moved)
    gone = _compat.PrivateAPI("ray", "ray._private.worker", "_temp_dir_renamed", "2.60.0", kind="text")
    with pytest.raises(_compat.CompatError, match="no longer mentions '_temp_dir_renamed'"):
        _compat.resolve(gone)


def test_env_only_torch_config_builds_on_this_ray():
    pytest.importorskip("ray.train")
    config = _compat.env_only_torch_config("gloo")
    assert config.backend == "gloo" and hasattr(config.backend_cls, "on_start")


def _private_uses(path: Path) -> list[str]:
    """Private names of torch, Ray, atexit or multiprocessing that a module imports or reaches."""
    watched = ("torch", "ray", "atexit", "multiprocessing")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in watched:
            parts = node.module.split(".") + [alias.name for alias in node.names]
            found += [f"{node.module}: {p}" for p in parts if p.startswith("_") and not p.startswith("__")]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in watched and any(p.startswith("_") for p in parts):
                    found.append(alias.name)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in (*watched, "dist", "rdzv", "forkserver"):
                found.append(f"{base.id}...{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("_"):
            found.append(f"keyword {node.arg}")
    return found


# The four kinds of private use the launchers had before _compat: the scan must see each.
SCATTERED = """
from ray.train.v2._internal.logging.patch_print import _original_print
from ray.train.torch.config import TorchConfig, _TorchBackend
import ray._raylet
original = rdzv._rendezvous_handlers["env"]
ray.init(num_cpus=2, _temp_dir=temp_dir)
atexit._run_exitfuncs()
"""


def test_no_other_module_of_the_package_uses_a_private_name(tmp_path):
    offenders = {p.name: _private_uses(p) for p in LAUNCH.glob("*.py") if p.name != "_compat.py"}
    assert not {name: uses for name, uses in offenders.items() if uses}, offenders
    for line in SCATTERED.strip().splitlines():
        sample = tmp_path / "scattered.py"
        sample.write_text(line + "\n")
        assert _private_uses(sample), f"the scan misses {line!r}"


def test_raylet_notices_are_dropped_and_worker_lines_kept(capsys):
    import ray._private.worker as ray_worker

    from helpers.launch import _compat

    notice = {"pid": "raylet", "lines": ["A worker died or was killed ... Worker IP address: 10.0.0.7"],
              "is_err": False, "ip": "10.0.0.7", "job": "01", "actor_name": "", "task_name": ""}
    line = dict(notice, pid=1234, lines=["rank 1: simulated crash"])
    with _compat.ray_raylet_notices_dropped():
        ray_worker.print_to_stdstream(notice, ignore_prefix=True)
        ray_worker.print_to_stdstream(line, ignore_prefix=True)
    out = capsys.readouterr().out
    assert "A worker died" not in out and "rank 1: simulated crash" in out
    ray_worker.print_to_stdstream(notice, ignore_prefix=True)   # outside the block: Ray's own behaviour
    assert "A worker died" in capsys.readouterr().out


def test_the_forkserver_is_recognised_by_its_main_on_the_stack(monkeypatch):
    """forkserver_output redirects the server's output only where multiprocessing's forkserver `main` runs."""
    import multiprocessing.forkserver

    assert _compat.in_forkserver_preload() is False

    def main_of_a_server():
        return (lambda: _compat.in_forkserver_preload())()   # a frame or two below the server's main

    monkeypatch.setattr(multiprocessing.forkserver, "main", main_of_a_server)
    assert main_of_a_server() is True
