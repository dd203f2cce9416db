"""The shared core of helpers.launch, without starting a process: the validator, the payload, the
failure records and rebuilt exceptions, and the one-way imports between the package's modules."""

from __future__ import annotations

import ast
import errno
import os
import pickle
import sys
import threading
from pathlib import Path

import pytest

from helpers import LaunchError, LaunchOptions, LaunchPlan, RankError, RankFailedError, plan_launch
from helpers.launch import errors, options, payload
from helpers.launch.errors import RankExceptionRecord, RankExitStatus, rebuild_exception, root_cause
from helpers.launch.options import LOCAL, RAY, check_options, plan_threads

LAUNCH = Path(options.__file__).parent


# ------------------------------------------------------------------------------------------ options


def test_the_machine_facts_are_arguments():
    assert plan_launch(LaunchOptions(), gpus=8) == LaunchPlan(8, "cuda", "nccl")
    assert plan_launch(LaunchOptions(), gpus=0) == LaunchPlan(2, "cpu", "gloo")
    assert plan_launch(LaunchOptions(device="cpu", processes=3), gpus=8) == LaunchPlan(3, "cpu", "gloo")
    plan = plan_launch(LaunchOptions(processes=2, device="cpu"))
    assert plan_threads(LaunchOptions(), plan, cpus=16) == 8
    assert plan_threads(LaunchOptions(), plan, cpus=1) == 1
    assert plan_threads(LaunchOptions(threads_per_process=3), plan, cpus=16) == 3
    gpu_plan = plan_launch(LaunchOptions(), gpus=2)
    assert plan_threads(LaunchOptions(), gpu_plan) is None, "GPU ranks keep their own threads"


def test_thread_override_from_the_environment(monkeypatch):
    plan = plan_launch(LaunchOptions(processes=2, device="cpu"))
    monkeypatch.setenv("GALLERY_THREADS_PER_PROCESS", "5")
    assert plan_threads(LaunchOptions(), plan, cpus=16) == 5
    monkeypatch.setenv("GALLERY_THREADS_PER_PROCESS", "none")
    with pytest.raises(LaunchError, match="GALLERY_THREADS_PER_PROCESS='none'"):
        plan_threads(LaunchOptions(), plan, cpus=16)


def test_backend_differences_are_explicit():
    check_options(LaunchOptions(backend="mpi"), LOCAL)
    with pytest.raises(LaunchError, match="backend='mpi': Ray Train workers use 'nccl'"):
        check_options(LaunchOptions(backend="mpi", cluster="ray"), RAY)
    with pytest.raises(LaunchError, match="backend='tcp' is not a torch.distributed backend"):
        check_options(LaunchOptions(backend="tcp"), LOCAL)
    with pytest.raises(LaunchError, match="the Ray cluster has 1 GPU"):
        plan_launch(LaunchOptions(processes=2, cluster="ray"), gpus=1, target=RAY)
    plan = plan_launch(LaunchOptions(device="cpu", cluster="ray"), target=RAY)
    assert plan_threads(LaunchOptions(cluster="ray"), plan, target=RAY, cpus=16) is None, "Ray sets them"


@pytest.mark.parametrize("changes, fix", [
    ({"threads_per_process": 0}, "threads_per_process=0"),
    ({"max_restarts": 1.5}, "max_restarts"),
    ({"progress": "yes"}, "progress='yes'"),
    ({"device": "tpu"}, "device='tpu'"),
    ({"cluster": 3}, "cluster=3"),
    ({"verbose": "yes"}, "verbose='yes'"),
])
def test_every_option_is_checked_in_one_place(changes, fix):
    with pytest.raises(LaunchError, match=fix):
        check_options(LaunchOptions(**changes))


# ------------------------------------------------------------------------------------------ payload


def test_the_culprit_is_named():
    with pytest.raises(LaunchError, match=r"argument 'lock' \(lock\) cannot be sent"):
        payload.serialise_call(print, (1,), {"lock": threading.Lock()})
    with pytest.raises(LaunchError, match=r"the function \(function\) cannot be sent"):
        lock = threading.Lock()
        payload.serialise_call(lambda: lock, (), {})


@pytest.fixture
def environ_restored():
    """Payload.apply changes this process's environment as a rank's: every variable is put back after."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _apply(monkeypatch, tmp_path, setup: payload.RankSetup, env: dict[str, str],
           prefixes: tuple[str, ...] = ()) -> None:
    for key in ("GALLERY_PAYLOAD_NEW", "GALLERY_PROGRESS", "GALLERY_PROGRESS_DIR"):
        os.environ.pop(key, None)
    os.environ.update(GALLERY_PAYLOAD_OLD="the worker's", RANK="1")
    monkeypatch.setattr(sys, "path", ["", "/worker/site-packages"])
    monkeypatch.chdir(tmp_path)
    p = payload.Payload(call=payload.serialise_call(len, ("abc",), {}), backend="gloo", device="cpu",
                        threads=None, progress=False, env=env, sys_path=("", "/driver/notebooks"),
                        cwd=str(tmp_path), prefixes=prefixes)
    p = payload.Payload.from_bytes(p.to_bytes())
    p.apply(setup)
    fn, args, kwargs = p.load_call()
    assert fn(*args, **kwargs) == 3
    assert os.environ["RANK"] == "1", "a per-worker variable is never replaced"
    assert os.environ["GALLERY_DIST_BACKEND"] == "gloo" and os.environ["MPLBACKEND"] == "Agg"
    assert os.environ["GALLERY_PROGRESS"] == "off", "nobody draws the bars: off in the rank"


def test_a_local_rank_takes_the_callers_values(monkeypatch, tmp_path, environ_restored):
    env = {"GALLERY_PAYLOAD_NEW": "set", "GALLERY_PAYLOAD_OLD": "the driver's", "RANK": "0"}
    _apply(monkeypatch, tmp_path, payload.LOCAL_RANKS, env)
    assert os.environ["GALLERY_PAYLOAD_OLD"] == "the driver's"
    assert sys.path == ["", "/driver/notebooks"]


def test_another_machine_keeps_its_own_values(monkeypatch, tmp_path, environ_restored):
    env = {"GALLERY_PAYLOAD_NEW": "set", "GALLERY_PAYLOAD_OLD": "the driver's", "RANK": "0"}
    _apply(monkeypatch, tmp_path, payload.RAY_WORKERS, env)
    assert os.environ["GALLERY_PAYLOAD_OLD"] == "the worker's" and os.environ["GALLERY_PAYLOAD_NEW"] == "set"
    assert sys.path == ["", "/driver/notebooks", "/worker/site-packages"]


def test_another_interpreter_keeps_its_environment_and_takes_the_callers_folders(monkeypatch, tmp_path,
                                                                                 environ_restored):
    env = {"GALLERY_PAYLOAD_OLD": "the driver's", "PYTHONPATH": "/driver/lib", "PATH": "/driver/bin"}
    monkeypatch.setenv("PYTHONPATH", "/worker/lib")
    _apply(monkeypatch, tmp_path, payload.OTHER_PYTHON_RANKS, env, prefixes=("/driver/env",))
    assert os.environ["GALLERY_PAYLOAD_OLD"] == "the driver's" and os.environ["PYTHONPATH"] == "/worker/lib"
    assert os.environ["VIRTUAL_ENV"] == sys.prefix
    assert os.environ["PATH"] == os.pathsep.join([os.path.dirname(sys.executable), "/driver/bin"])
    assert sys.path == ["", "/driver/notebooks", "/worker/site-packages"]


def test_each_kind_of_rank_keeps_the_variables_its_launcher_sets():
    local, ray, other = payload.LOCAL_RANKS.kept, payload.RAY_WORKERS.kept, payload.OTHER_PYTHON_RANKS.kept
    assert {"RANK", "GROUP_RANK"} <= local and "NODE_RANK" not in local
    assert {"RANK", "NODE_RANK", "PWD"} <= ray and "GROUP_RANK" not in ray
    assert other == local | {"PATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "CONDA_PREFIX",
                             "CONDA_DEFAULT_ENV", "PYTHONEXECUTABLE", "__PYVENV_LAUNCHER__"}
    with pytest.raises(ValueError, match="import_path='sideways'"):
        payload.RankSetup("x", frozenset(), (), caller_values_win=True, import_path="sideways")


# ------------------------------------------------------------------------------------------- errors


def _failure(exc: BaseException, rank: int = 1, attempt: int = 0, at: float = 0.0) -> RankExceptionRecord:
    try:
        raise exc
    except BaseException as raised:
        failure = RankExceptionRecord.capture(raised, rank, attempt)
    return RankExceptionRecord(**{**failure.__dict__, "time": at}) if at else failure


def test_root_cause_is_the_earliest_real_failure_of_the_last_attempt():
    first_try = _failure(ValueError("attempt 0"), rank=0, attempt=0, at=1.0)
    peer = _failure(RuntimeError("broken pipe"), rank=0, attempt=1, at=3.0)
    cause = _failure(ValueError("bad batch"), rank=1, attempt=1, at=2.0)
    stopped = _failure(KeyboardInterrupt(), rank=2, attempt=1, at=1.5)
    assert root_cause([first_try, peer, cause, stopped]) is cause
    assert root_cause([stopped]) is stopped, "an interrupt counts when nothing else was raised"
    assert root_cause([]) is None


class CustomError(Exception):
    def __init__(self, code, detail):  # two required arguments: no `type(e)(message)` rebuild
        super().__init__(code, detail)
        self.code = code


def test_rebuilt_exception_keeps_type_attributes_and_rank():
    exc = rebuild_exception(_failure(CustomError(7, "detail"), rank=1), world_size=2)
    assert isinstance(exc, CustomError) and isinstance(exc, RankError)
    assert type(exc).__name__ == "CustomError", "a notebook shows the original's name"
    assert exc.code == 7 and exc.args == (7, "detail")
    assert (exc.rank, exc.world_size) == (1, 2) and "in _failure" in exc.remote_traceback
    assert str(exc).startswith("rank 1 of 2 raised CustomError: (7, 'detail')")
    assert any("raised on rank 1 of 2" in note for note in exc.__notes__)
    oserror = rebuild_exception(_failure(FileNotFoundError(errno.ENOENT, "no file", "/x")), 2)
    assert isinstance(oserror, FileNotFoundError)
    assert (oserror.errno, oserror.filename) == (errno.ENOENT, "/x")
    again = pickle.loads(pickle.dumps(exc))
    assert isinstance(again, CustomError) and again.code == 7 and again.rank == 1 and str(again) == str(exc)


def test_interrupts_stay_outside_except_exception():
    exc = rebuild_exception(_failure(KeyboardInterrupt()), 2)
    assert isinstance(exc, KeyboardInterrupt) and not isinstance(exc, Exception) and exc.rank == 1


class Final(type):
    def __new__(mcls, name, bases, ns):
        if any(isinstance(b, Final) for b in bases):
            raise TypeError("final class")
        return super().__new__(mcls, name, bases, ns)


class NoSubclasses(Exception, metaclass=Final):
    pass


def test_a_class_that_refuses_subclasses_keeps_its_type_and_gets_the_message_as_a_note():
    exc = rebuild_exception(_failure(NoSubclasses("x")), 2)
    assert type(exc) is NoSubclasses and exc.rank == 1
    assert any(note.startswith("rank 1 of 2 raised NoSubclasses: x") for note in exc.__notes__)


def test_an_exception_that_did_not_travel_and_a_killed_rank():
    unpicklable = RankExceptionRecord(rank=0, attempt=0, time=0.0, type_name="Weird", message="m",
                                      traceback="tb")
    exc = rebuild_exception(unpicklable, 2)
    assert isinstance(exc, RankFailedError) and "rank 0 of 2 raised Weird: m" in str(exc)
    exit_status = RankExitStatus(rank=1, exitcode=-9, signal_name="SIGKILL")
    killed = errors.job_failure([], 2, exit_status, logs="see above")
    assert isinstance(killed, RankFailedError) and isinstance(killed, RankError)
    assert (killed.rank, killed.exitcode) == (1, -9) and "killed by signal SIGKILL" in str(killed)
    assert RankExceptionRecord.from_bytes(b"not a record") is None


# -------------------------------------------------------------------------------------- the imports


LAYERS = {"_compat": 0, "decisions": 0, "errors": 0, "options": 0, "forkserver_output": 1, "payload": 1,
          "ray_instance": 1, "local_worker": 2, "local": 3, "ray": 3, "__init__": 4}


def _imports(module: str) -> set[str]:
    tree = ast.parse((LAUNCH / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers.launch"):
            parts = node.module.split(".")
            found.update([parts[2]] if len(parts) > 2 else [a.name for a in node.names])
    return found - {module}


@pytest.mark.parametrize("module", sorted(LAYERS))
def test_imports_run_one_way(module):
    """__init__ -> local / ray -> the core (payload, ray_instance -> options, errors, _compat); never up."""
    assert {p.stem for p in LAUNCH.glob("*.py")} == set(LAYERS), "a new module needs a layer here"
    upward = {m for m in _imports(module) if LAYERS[m] >= LAYERS[module]}
    assert not upward, f"{module} imports {upward}, which sit at its level or above"


# ------------------------------------------------------------------------------ the whole package

HELPERS = LAUNCH.parent
# Which subsystem may import which: the launcher, the gallery runner and the integrations sit above the
# shared modules; the launcher never reaches up into the gallery, the integrations or the data builders.
NEVER = {"launch": {"gallery", "integrations", "data", "models"},
         "progress": {"launch", "gallery", "integrations"},
         "data": {"launch", "gallery", "integrations"},
         "models": {"launch", "gallery", "integrations"}}


def _module_name(path: Path) -> str:
    parts = path.relative_to(HELPERS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports() -> dict[str, set[str]]:
    """Each helpers module -> the helpers modules it imports (at any depth in its body)."""
    modules = {_module_name(p): p for p in HELPERS.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    found.add(full if full in modules else base)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def test_no_import_cycle_in_the_package():
    """Module-level and function-level imports alike: a cycle hidden in a function is still a tangle."""
    graph = package_imports()
    graph = {k: {m for m in v if m != "helpers"} for k, v in graph.items()}  # `helpers` itself: the lazy API
    assert not _cycles(graph), _cycles(graph)


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert not _cycles({"a": {"b"}, "b": {"c"}, "c": set()})


def test_subsystems_import_one_way():
    """gallery/ may import launch/; launch/ never imports gallery/, integrations/, data/ or models/."""
    wrong = {}
    for module, imported in package_imports().items():
        parts = module.split(".")
        if len(parts) < 2 or parts[1] not in NEVER:
            continue
        bad = {m for m in imported if len(m.split(".")) > 1 and m.split(".")[1] in NEVER[parts[1]]}
        if bad:
            wrong[module] = bad
    assert not wrong, wrong


def test_the_lazy_api_imports_every_public_name():
    import helpers

    for name in helpers.__all__:
        assert getattr(helpers, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        helpers.nothing_here  # noqa: B018


def test_import_helpers_imports_no_torch_and_changes_nothing():
    """`python -X importtime -c "import helpers"` lists no torch, and the process keeps torch's defaults."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import helpers, logging; "
                          "print(logging.getLogger('torch.utils._pytree').filters)"],
                         capture_output=True, text=True, check=True)
    imported = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    assert not [m for m in imported if m.split(".")[0] == "torch"], "import helpers imported torch"
    assert out.stdout.strip() == "[]", "import helpers installed log filters"


def test_gallery_list_imports_no_torch():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "helpers.gallery", "--list"],
                         capture_output=True, text=True, check=True)
    imported = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    assert "01_ddp_mlp" in out.stdout
    assert "torch" not in imported, "python -m helpers.gallery --list imported torch"
