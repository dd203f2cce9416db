"""The launcher's contract: results, errors, interrupts, restarts and argument checks, on CPU with gloo."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import LaunchError, LaunchOptions, LaunchPlan, RankFailedError, distributed, plan_launch

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids, seconds=15.0) -> list[int]:
    deadline = time.time() + seconds
    while time.time() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@distributed(processes=2)
def allreduce_rank(offset):
    import torch
    import torch.distributed as dist

    from helpers import worker_context

    ctx = worker_context()
    dist.init_process_group(ctx.backend)
    t = torch.tensor([float(ctx.rank + offset)])
    dist.all_reduce(t)
    print(f"rank {ctx.rank} of {ctx.world_size} sum {t.item()}")
    return {"rank": ctx.rank, "sum": t.item(), "env": {k: os.environ[k] for k in (
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}}


def test_results_in_rank_order_with_elastic_environment(capsys):
    results = allreduce_rank.distributed(10)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["sum"] == 21.0 for r in results)
    env0, env1 = results[0]["env"], results[1]["env"]
    assert (env0["RANK"], env1["RANK"]) == ("0", "1")
    assert env0["WORLD_SIZE"] == env0["LOCAL_WORLD_SIZE"] == "2"
    assert env0["MASTER_ADDR"] == "127.0.0.1"
    out = capsys.readouterr().out
    # Every rank's line arrived in the caller's stdout, whole and prefixed.
    assert "[rank0] rank 0 of 2 sum 21.0\n" in out
    assert "[rank1] rank 1 of 2 sum 21.0\n" in out


def test_two_launches_in_a_row_use_fresh_ports():
    first = allreduce_rank.distributed(0)
    second = allreduce_rank.distributed(1)
    assert [r["sum"] for r in first] == [1.0, 1.0]
    assert [r["sum"] for r in second] == [3.0, 3.0]
    assert first[0]["env"]["MASTER_PORT"] != second[0]["env"]["MASTER_PORT"]


@distributed(processes=1)
def gc_in_the_rank():
    import gc
    import weakref

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a   # a cycle: only the collector frees it
    ref = weakref.ref(a)
    del a, b
    gc.collect()
    return {"frozen": gc.get_freeze_count(), "cycle_collected": ref() is None}


def test_rank_freezes_what_it_imported_and_still_collects_what_it_creates():
    """Payload.load_call freezes the imported objects (a full collection skips them: benchmarks/rank_gc.py);
    the function's own garbage is still collected."""
    [report] = gc_in_the_rank.distributed()
    assert report["frozen"] > 50_000, f"only {report['frozen']} objects frozen: torch alone has more"
    assert report["cycle_collected"]


ELASTIC_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "GALLERY_DIST_BACKEND")


def test_in_process_call_is_rank_zero_of_one():
    before = {k: os.environ.get(k) for k in ELASTIC_ENV}
    result = allreduce_rank(5)
    assert result["rank"] == 0 and result["sum"] == 5.0
    assert result["env"]["WORLD_SIZE"] == "1"
    # The call's environment is gone afterwards: every variable as it was (unset ones unset).
    assert {k: os.environ.get(k) for k in ELASTIC_ENV} == before


def test_closure_and_driver_environment_reach_the_workers(monkeypatch):
    scale = 7

    class Box:  # a class defined inside a function travels by value, like a notebook cell's
        def __init__(self, v):
            self.v = v

    def make(factor):
        @distributed(processes=2)
        def work(x):
            return Box(x * factor * scale), os.environ.get("GALLERY_TEST_MARK")

        return work

    monkeypatch.setenv("GALLERY_TEST_MARK", "set-after-the-forkserver-started")
    results = make(3).distributed(2)
    assert [b.v for b, _ in results] == [42, 42]
    assert {mark for _, mark in results} == {"set-after-the-forkserver-started"}


def test_large_arguments_do_not_block():
    big = np.arange(4_000_000, dtype=np.float64)  # 32 MB, far past a pipe's 64 KB buffer

    @distributed(processes=2)
    def total(a):
        return float(a.sum()), a.nbytes

    results = total.distributed(big)
    assert results == [(float(big.sum()), big.nbytes)] * 2


class CustomError(Exception):
    def __init__(self, code, detail):  # two required arguments: cannot be rebuilt from a message
        super().__init__(code, detail)
        self.code = code


def test_failing_rank_raises_original_type_with_rank_and_traceback(tmp_path):
    @distributed(processes=2)
    def fail_on_one(pid_dir):
        import torch.distributed as dist

        from helpers import worker_context

        ctx = worker_context()
        Path(pid_dir, str(ctx.rank)).write_text(str(os.getpid()))
        dist.init_process_group(ctx.backend)
        if ctx.rank == 1:
            time.sleep(0.5)
            raise ValueError("the data on rank one is bad")
        time.sleep(120)  # rank 0 would hang for two minutes: it must be stopped instead

    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        fail_on_one.distributed(str(tmp_path))
    assert time.perf_counter() - start < 30
    message = str(info.value)
    assert "rank 1 of 2" in message
    assert "the data on rank one is bad" in message
    assert "remote traceback" in message and "fail_on_one" in message
    assert info.value.rank == 1
    pids = [int(p.read_text()) for p in tmp_path.iterdir()]
    assert len(pids) == 2 and not _wait_gone(pids)


def test_exception_that_cannot_be_rebuilt_keeps_type_and_gets_a_note():
    @distributed(processes=2)
    def fail():
        if os.environ["RANK"] == "0":
            raise CustomError(7, "detail")
        return 1

    with pytest.raises(CustomError) as info:
        fail.distributed()
    assert info.value.code == 7
    assert any("rank 0 of 2" in note for note in info.value.__notes__)


def test_rank_killed_by_signal_is_reported_as_such():
    @distributed(processes=2)
    def die():
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)

    with pytest.raises(RankFailedError, match="SIGKILL") as info:
        die.distributed()
    assert info.value.rank == 1


def test_max_restarts_restarts_the_group():
    @distributed(processes=2, max_restarts=1)
    def flaky():
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        if attempt == 0 and os.environ["RANK"] == "0":
            raise RuntimeError("first attempt fails")
        return attempt

    assert flaky.distributed() == [1, 1]
    with pytest.raises(RuntimeError, match="first attempt fails"):
        flaky.options(max_restarts=0).distributed()


def test_unserialisable_return_value_names_the_fix():
    @distributed(processes=2)
    def returns_lock():
        return threading.Lock()

    with pytest.raises(TypeError, match="cannot be serialised.*Return plain Python values"):
        returns_lock.distributed()


@pytest.mark.parametrize(
    "processes, fix",
    [(0, "at least 1"), (-2, "at least 1"), (1.5, "whole number"), ("2", "whole number"),
     (True, "whole number")],
)
def test_bad_process_counts_fail_before_any_process(processes, fix):
    # The argument cannot be sent: had the payload been built first, its error would have come instead.
    with pytest.raises(LaunchError, match=fix):
        distributed(processes=processes)(print).distributed(threading.Lock())


def test_more_gpus_than_exist():
    with pytest.raises(LaunchError, match=r"this machine has 1 GPU.*processes=1.*device='cpu'"):
        plan_launch(LaunchOptions(processes=2), gpus=1)
    assert distributed(processes=2, device="cpu")(print).plan(gpus=1).processes == 2
    assert distributed()(print).plan(gpus=1) == LaunchPlan(1, "cuda", "nccl")


def test_cuda_without_gpu_and_unknown_options():
    with pytest.raises(LaunchError, match="no usable GPU"):
        distributed(device="cuda")(print).plan(gpus=0)
    with pytest.raises(LaunchError, match="unknown launch option"):
        distributed(proceses=2)
    with pytest.raises(LaunchError, match="'fork' is refused"):
        distributed(start_method="fork")(print).plan(gpus=0)
    assert distributed()(print).plan(gpus=0) == LaunchPlan(2, "cpu", "gloo")


def test_unpicklable_argument_fails_before_launch(monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("elastic_launch must not be reached")

    monkeypatch.setattr("torch.distributed.launcher.api.elastic_launch", no_launch)
    with pytest.raises(LaunchError, match=r"argument 0 \(lock\) cannot be sent"):
        distributed(processes=2)(print).distributed(threading.Lock())


INTERRUPT_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    from pathlib import Path
    from helpers import distributed

    pid_dir = Path(sys.argv[1])

    @distributed(processes=2)
    def sleeper(pid_dir):
        Path(pid_dir, os.environ["RANK"]).write_text(str(os.getpid()))
        print("started", flush=True)
        time.sleep(120)

    def interrupt_when_started():
        while len(list(pid_dir.iterdir())) < 2:
            time.sleep(0.05)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)   # what a Jupyter "interrupt kernel" does

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    outcome = None
    start = time.time()
    try:
        sleeper.distributed(str(pid_dir))
    except KeyboardInterrupt as e:
        outcome = f"KeyboardInterrupt: {e}"
    stopped_in = time.time() - start
    handler = signal.getsignal(signal.SIGINT)
    handler_restored = handler is signal.default_int_handler

    @distributed(processes=2)
    def again():
        return int(os.environ["RANK"])

    print(json.dumps({"outcome": outcome, "handler_restored": handler_restored, "handler": repr(handler),
                      "again": again.distributed(), "stopped_in": stopped_in}))
    """
)


def test_interrupt_stops_every_worker_and_the_next_launch_works(tmp_path):
    script = tmp_path / "interrupt.py"
    script.write_text(INTERRUPT_SCRIPT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    proc = subprocess.run([sys.executable, str(script), str(pid_dir)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["outcome"] and report["outcome"].startswith("KeyboardInterrupt"), report
    assert report["handler_restored"], (report, proc.stderr[-3000:])
    assert report["again"] == [0, 1]
    assert report["stopped_in"] < 30
    pids = [int(p.read_text()) for p in pid_dir.iterdir()]
    assert len(pids) == 2 and not _wait_gone(pids)


def test_script_main_module_is_not_rerun_in_workers(tmp_path):
    """`python train.py` without a __main__ guard must not execute train.py again in every rank."""
    script = tmp_path / "unguarded.py"
    marker = tmp_path / "imports"
    script.write_text(textwrap.dedent(f"""
        import os
        from helpers import distributed
        with open({str(marker)!r}, "a") as f:
            f.write(str(os.getpid()) + "\\n")
        print(distributed(processes=2)(lambda: int(os.environ["RANK"])).distributed())
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("[0, 1]")
    assert len(marker.read_text().split()) == 1


def test_restarted_group_reinitialises_its_process_group_and_reports_the_last_failure():
    """A restart must not read the dead group's store keys; the error raised is the last attempt's."""

    @distributed(processes=2, max_restarts=1)
    def collective(fail_attempts):
        import torch
        import torch.distributed as dist

        from helpers import worker_context

        ctx = worker_context()
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        dist.init_process_group(ctx.backend)
        t = torch.tensor([1.0])
        dist.all_reduce(t)
        if attempt in fail_attempts and ctx.rank == 1:
            raise RuntimeError(f"attempt {attempt} failed")
        return attempt, t.item()

    assert collective.distributed([0]) == [(1, 2.0), (1, 2.0)]
    with pytest.raises(RuntimeError, match="attempt 1 failed"):
        collective.distributed([0, 1])


def test_ranks_end_when_the_launching_process_dies(tmp_path):
    """A kernel killed outright (SIGKILL: no handler runs) must not leave its ranks running."""
    script = tmp_path / "launch_and_wait.py"
    script.write_text(textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        from helpers import distributed

        @distributed(processes=2, device="cpu")
        def linger():
            Path({str(tmp_path)!r}, f"rank{{os.environ['RANK']}}.pid").write_text(str(os.getpid()))
            time.sleep(300)

        linger.distributed()
    """))
    launcher = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    pid_files = [tmp_path / "rank0.pid", tmp_path / "rank1.pid"]
    deadline = time.monotonic() + 120
    while not all(p.exists() for p in pid_files) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(p.exists() for p in pid_files), "the ranks never started"
    ranks = [int(p.read_text()) for p in pid_files]
    launcher.kill()
    launcher.wait()

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return not Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"   # a zombie has ended

    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [pid for pid in ranks if alive(pid)]
    for pid in left:   # do not leave them behind even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks {left} outlived the process that launched them"


def test_preload_starts_the_forkserver_at_once_with_those_modules(tmp_path):
    """preload(...) in a notebook's import cell: the server is up before any launch, the ranks start with the
    modules imported, a re-run of the cell is silent, and a module asked for too late is named in a warning
    (it cannot join a running server). What a module prints as the server imports it goes to the server's log,
    not to the caller's output (in Jupyter: whichever cell runs then). A fresh interpreter: no other test's
    server counts."""
    (tmp_path / "noisy_at_import.py").write_text("import sys\nprint('banner on stdout')\n"
                                                 "print('banner on stderr', file=sys.stderr)\n")
    code = textwrap.dedent("""
        import json, os, sys, time, warnings
        import psutil
        from helpers import distributed, preload
        from helpers.launch import local

        assert preload("colorsys", "noisy_at_import") is None   # it ends a notebook's import cell: no output
        listed = local._forkserver_modules
        # the server is forked, then execs: until it has, its command line is still this process's
        deadline = time.monotonic() + 10
        while True:
            servers = [p for p in psutil.Process().children()
                       if "multiprocessing.forkserver" in " ".join(p.cmdline())]
            if servers or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            preload("colorsys")
            rerun_quiet = not caught
            preload("wave")

        @distributed(processes=2, device="cpu")
        def probe():
            import sys
            print("a rank prints", flush=True)
            return ["colorsys" in sys.modules, "wave" in sys.modules, "noisy_at_import" in sys.modules]

        print(json.dumps({"listed": listed, "servers": [p.pid for p in servers], "rerun_quiet": rerun_quiet,
                          "late": [str(w.message) for w in caught], "ranks": probe.distributed(),
                          "caller": "colorsys" in sys.modules}))
    """)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "GALLERY_PRELOAD": "",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["listed"] == ["helpers.launch.forkserver_output", "helpers.launch.local_worker",
                                "torch._dynamo", "colorsys", "noisy_at_import"]   # what optimizers import too
    assert len(report["servers"]) == 1, "preload did not start the forkserver before the launch"
    assert report["rerun_quiet"]
    assert len(report["late"]) == 1 and "['wave'] will be imported by each rank instead" in report["late"][0]
    assert report["ranks"] == [[True, False, True], [True, False, True]] and report["caller"] is False
    assert "banner" not in out.stdout + out.stderr, "the forkserver's import output reached the caller"
    assert "[rank0] a rank prints" in out.stdout   # the ranks' own output still does
    from helpers.launch.forkserver_output import log_path

    log = Path(log_path(report["servers"][0]))
    assert log.read_text() == "banner on stdout\nbanner on stderr\n"
    log.unlink()


def test_preload_refuses_a_module_that_does_not_exist_before_starting_anything():
    """The forkserver skips a module it cannot import without a word; preload names it instead. The check
    finds submodules without importing their packages (the server is there to import them)."""
    from helpers.launch import local

    with pytest.raises(ValueError, match=r"no module named 'trl\.trainer\.sft_trainr', 'nosuch' in this"):
        local.preload("trl.trainer.sft_trainer", "trl.trainer.sft_trainr", "nosuch")
    assert all(local._module_exists(m) for m in ("trl.trainer.sft_trainer", "torchvision.models.detection"))


def test_preload_adds_nothing_on_a_machine_with_gpus(monkeypatch):
    """Libraries that set CUDA up as they load (bitsandbytes under PEFT, Unsloth) would leave a forkserver
    whose ranks cannot use the GPU: with GPUs, only torch is pre-loaded and each rank imports the rest."""
    from helpers.launch import local

    calls = []
    monkeypatch.setattr(local, "_forkserver_ready", False)
    monkeypatch.setattr(local, "_forkserver_modules", ["helpers.launch.local_worker"])
    monkeypatch.setattr(local, "prepare_forkserver", lambda start_now, modules: calls.append(modules))
    monkeypatch.setattr(local, "gpu_count", lambda: 2)
    local.preload("peft", "colorsys")
    monkeypatch.setattr(local, "gpu_count", lambda: 0)
    local.preload("peft", "colorsys")
    local.preload("peft", optimizers=False)
    assert calls == [(), ("torch._dynamo", "peft", "colorsys"), ("peft",)]


def test_helpers_preload_imports_once_in_the_forkserver():
    """GALLERY_PRELOAD (set before the first @distributed, e.g. outside the notebook) makes every rank of
    every launch start with those modules imported; without it a rank imports them itself (torch._dynamo:
    1.2 s, which every torch optimizer pays when built). A fresh interpreter each: no other test's server
    counts."""
    code = textwrap.dedent("""
        import sys
        from helpers import distributed

        @distributed(processes=2, device="cpu")
        def probe():
            import sys
            return "torch._dynamo" in sys.modules

        print(probe.distributed(), "torch._dynamo" in sys.modules)
    """)
    seen = {}
    for preload in ("torch._dynamo", ""):
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "GALLERY_PRELOAD": preload}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                             cwd=ROOT, env=env)
        assert out.returncode == 0, out.stderr
        seen[preload] = out.stdout.strip().splitlines()[-1]
    # ranks: with it, without it; the caller (last) never imported it
    assert seen == {"torch._dynamo": "[True, True] False", "": "[False, False] False"}


@distributed(processes=2)
def _fails_on_rank_one():
    from helpers import worker_context

    if worker_context().rank == 1:
        raise ValueError("rank one fails")
    return 0


@pytest.mark.parametrize("verbose", [False, True])
def test_verbose_lets_torch_elastic_log_the_failure(verbose, caplog):
    """The agent's own records of a failed worker come through only with verbose=True."""
    import logging

    with caplog.at_level(logging.INFO, logger="torch.distributed.elastic"), pytest.raises(ValueError):
        _fails_on_rank_one.options(verbose=verbose).distributed()
    agent = [r for r in caplog.records if r.name.startswith("torch.distributed.elastic")]
    assert bool(agent) == verbose, [r.getMessage()[:120] for r in agent]


def test_cpu_ranks_see_no_gpu(monkeypatch):
    """device="cpu" on a GPU machine: a library that picks the accelerator itself (FSDP2's default mesh) must
    not find one, or rank 1 of a 1-GPU machine fails with "invalid device ordinal" (seen in the GPU check)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")   # what a kernel on a GPU machine has

    @distributed(processes=2, device="cpu")
    def visible():
        import torch

        accelerator = torch._C._get_accelerator().type
        return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), accelerator

    assert visible.distributed() == [("", 0, "cpu")] * 2
