"""The local launcher: every rank a process of this machine, started by torch elastic.

Built on torch's own elastic launcher (`torch.distributed.launcher.api.elastic_launch`): it gives the
workers the standard environment (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
`MASTER_ADDR`, `MASTER_PORT`) so DDP, FSDP, DeepSpeed, Lightning, accelerate and Streaming work
inside unchanged, restarts the group on failure (`max_restarts`) and stops every rank when one dies.
What this module adds is what a notebook needs on top of it:

* the payload travels through a file, so large arguments never block a pipe;
* workers come from a forkserver that has torch pre-loaded: nothing is forked from a kernel that may
  have touched CUDA, and a re-run starts in a fraction of torchrun's time;
* an interrupt (kernel stop) stops the workers and gives the kernel its signal handlers back.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from helpers.env import project_env
from helpers.launch import _compat, local_worker
from helpers.launch.errors import RankExitStatus, job_failure
from helpers.launch.options import (
    LOCAL,
    LaunchOptions,
    LaunchPlan,
    gpu_count,
    launch_progress_view,
    plan_launch,
    plan_threads,
)
from helpers.launch.payload import Payload, load_results, serialise_call
from helpers.logs import quieted
from helpers.progress import watch_progress_dir

log = logging.getLogger(__name__)
_HANDLED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
_forkserver_ready = False
# Imported by the forkserver only, first: it sends the server's own output to a file (the module says why).
FORKSERVER_OUTPUT = "helpers.launch.forkserver_output"
_forkserver_modules: list[str] = []


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now, so two launches (or two kernels) never share a rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _preload_list(modules: tuple[str, ...] = ()) -> list[str]:
    """The forkserver's imports: its output to a file, the worker module (and torch with it), `modules`, then
    GALLERY_PRELOAD's."""
    extra = [m.strip() for m in (project_env("PRELOAD") or "").split(",") if m.strip()]
    return list(dict.fromkeys([FORKSERVER_OUTPUT, local_worker.__name__, *modules, *extra]))


def prepare_forkserver(start_now: bool = False, modules: tuple[str, ...] = ()) -> None:
    """Ask the forkserver to import torch (through the worker module) once, before its first fork.

    With start_now, the server process starts at once and imports torch while the notebook goes on
    (the decorator calls this), so the first launch a few cells later finds it warm.
    """
    global _forkserver_ready, _forkserver_modules
    if not _forkserver_ready:
        # Spinning OpenMP threads steal the cores of the other ranks on a CPU launch; libgomp reads this
        # once, when the forkserver imports torch, so it is set before the server starts.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        # Only torch by default: every extra module delays the first launch by its import time, which is what
        # a cold launch pays (benchmarks/launch_latency.py measures it). Notebooks that launch many times with
        # FSDP, DeepSpeed or Lightning (which import dynamo lazily in every rank) add them with `preload(...)`
        # or GALLERY_PRELOAD="torch._dynamo,torch.distributed.checkpoint" before the first @distributed.
        _forkserver_modules = _preload_list(modules)
        multiprocessing.get_context("forkserver").set_forkserver_preload(_forkserver_modules)
        _forkserver_ready = True
    if start_now:
        with contextlib.suppress(Exception):  # a failure here only costs the head start
            _compat.start_forkserver()


def _module_exists(name: str) -> bool:
    """Whether `import name` would find the module, without importing it or its parent packages."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
        for part in parts[1:]:
            if spec is None or not spec.submodule_search_locations:
                return False
            spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    except (ImportError, ValueError):
        return False
    return spec is not None


# torch's optimizers import it when the first one is built (1.2 s a process): every training rank pays it.
OPTIMIZER_IMPORTS = ("torch._dynamo",)


def preload(*modules: str, optimizers: bool = True) -> None:
    """Start the launcher's forkserver now, importing `modules` there once; every rank forks from it.

    `optimizers=True` adds what building a torch optimizer imports (OPTIMIZER_IMPORTS): every training rank
    needs it, so a training notebook writes only its frameworks (`preload("deepspeed")`, or `preload()`).

    A rank that imports transformers, TRL and DeepSpeed itself spends seconds of every launch on it, each
    rank at once. Called in a notebook's import cell, the server imports them on a free core while the
    notebook goes on (its own imports, its data), and the ranks start with them loaded. GALLERY_PRELOAD
    (comma-separated) adds to the list. The server starts once per process: a later call with other
    modules cannot add them, and says so. (Nothing is returned: the call ends a notebook's import cell.)

    On a machine with GPUs it adds nothing to torch: libraries set CUDA up as they load (bitsandbytes, which
    PEFT and TRL import, asks every GPU for its compute capability; Unsloth reads the GPU's properties), and
    ranks forked from a process that has set CUDA up cannot use it. There each rank imports its modules.
    """
    unknown = [m for m in modules if not _module_exists(m)]
    modules = (*OPTIMIZER_IMPORTS, *modules) if optimizers else modules
    if unknown:   # the forkserver would skip it silently, and every rank would import it itself
        raise ValueError(f"preload: no module named {', '.join(map(repr, unknown))} in this environment; "
                         "check the spelling (a name as in `import name`)")
    if gpu_count():   # the launcher's own count: it does not set CUDA up in this process
        modules = ()
    if _forkserver_ready:
        missing = [m for m in _preload_list(modules) if m not in _forkserver_modules]
        if missing:
            warnings.warn(f"the launcher's forkserver already runs with {_forkserver_modules}; {missing} "
                          "will be imported by each rank instead. Call preload(...) before the first "
                          "@distributed (restart the kernel to change it now).", stacklevel=2)
    prepare_forkserver(start_now=multiprocessing.current_process().name == "MainProcess", modules=modules)


@contextlib.contextmanager
def _kernel_signal_handlers_kept() -> Iterator[None]:
    """torch elastic installs its own SIGINT/SIGTERM handlers and never puts the old ones back."""
    saved = {}
    if multiprocessing.current_process().name == "MainProcess":
        for name in _HANDLED_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                with contextlib.suppress(ValueError):
                    saved[sig] = signal.getsignal(sig)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)


@contextlib.contextmanager
def _main_module_not_rerun() -> Iterator[None]:
    """Keep multiprocessing from re-running a script's __main__ in every worker.

    The function already travels by value (cloudpickle), so the workers need nothing from __main__;
    without this, `python train.py` would execute train.py again in each rank, launch included.
    A notebook's __main__ has no file, so this changes nothing there.
    """
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    for k in saved:
        if k == "__spec__":
            main.__spec__ = None
        else:
            del main.__dict__[k]
    try:
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


@contextlib.contextmanager
def _quiet_elastic_logs(verbose: bool) -> Iterator[None]:
    """The agent logs every failure at length; the launch re-raises it in a shorter, more useful form."""
    if verbose:
        yield
        return
    with quieted(("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing"),
                 logging.CRITICAL):
        yield


def _exit_status(error: Any) -> RankExitStatus:
    """What torch elastic knows of the first rank that failed (a ChildFailedError)."""
    rank, first = error.get_first_failure()
    exitcode = first.exitcode if first is not None else None
    signal_name = first.signal_name() if exitcode is not None and exitcode < 0 else None
    return RankExitStatus(rank=rank, exitcode=exitcode, signal_name=signal_name)


def launch(fn: Callable[..., Any], args: tuple = (), kwargs: dict[str, Any] | None = None,
           options: LaunchOptions | None = None) -> list[Any]:
    """Run `fn(*args, **kwargs)` on every rank of this machine; each rank's return value, in rank order."""
    options = options or LaunchOptions()
    plan = plan_launch(options, target=LOCAL)
    threads = plan_threads(options, plan, target=LOCAL)
    view = launch_progress_view(options)
    call = serialise_call(fn, args, kwargs or {})  # fails here, before any process
    payload = Payload.capture(call, backend=plan.backend, device=plan.device, threads=threads,
                              progress=view is not None, verbose=options.verbose)
    log.info("plan: %d processes, device %s, torch backend %s", plan.processes, plan.device, plan.backend)
    log.info("threads per process: %s", threads or "torch's default")

    run_dir = Path(tempfile.mkdtemp(prefix="helpers-launch-"))
    log_root = Path(options.log_dir) if options.log_dir is not None else run_dir / "logs"
    payload_path = run_dir / "payload.pkl"
    payload_path.write_bytes(payload.to_bytes())
    if options.python is None and options.start_method == "forkserver":
        prepare_forkserver()
    config = _launch_config(options, plan, log_root)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    try:
        with _kernel_signal_handlers_kept(), _quiet_elastic_logs(options.verbose), _main_module_not_rerun(), \
                watch_progress_dir(run_dir / local_worker.PROGRESS_FOLDER, view):
            _run_ranks(config, options.python, payload_path, run_dir, plan.processes)
        return load_results(local_worker.stored_results(run_dir, plan.processes), plan.processes)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        shutil.rmtree(run_dir, ignore_errors=True)


def _launch_config(options: LaunchOptions, plan: LaunchPlan, log_root: Path) -> Any:
    """torch elastic's LaunchConfig: one machine, every rank's output in a file under `log_root` and teed."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    port = free_port(options.master_addr)
    log.info("rendezvous: %s:%d (a port free now), up to %d restart(s)", options.master_addr, port,
             options.max_restarts)
    return LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=plan.processes,
        run_id=f"helpers-{uuid.uuid4().hex[:12]}",
        # One machine: a static rendezvous over a c10d TCPStore on a fresh loopback port. The dynamic
        # c10d rendezvous would add a random 0-0.3 s join delay to every launch, meant for many nodes.
        rdzv_backend="static", rdzv_endpoint=f"{options.master_addr}:{port}",
        rdzv_configs={"rank": 0, "timeout": 60}, local_addr=options.master_addr,
        max_restarts=options.max_restarts, monitor_interval=0.05, start_method=options.start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(log_root), redirects=Std.ALL, tee=Std.ALL),
        log_line_prefix_template=options.prefix, **_compat.launch_config_stop_grace(options.stop_timeout),
    )


def _run_ranks(config: Any, python: str | None, payload_path: Path, run_dir: Path, world_size: int) -> None:
    """Start the ranks with torch elastic's agent and wait; a failure raises as the caller should see it."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    arguments = (str(payload_path), str(run_dir), os.getpid())
    try:
        if python is None:
            elastic_launch(config, local_worker.run)(*arguments)
        else:  # another environment's interpreter: each rank is a command, started by the same agent
            elastic_launch(config, python)(*local_worker.bootstrap_arguments(*arguments))
    except ChildFailedError as e:
        raise job_failure(local_worker.read_failures(run_dir), world_size, _exit_status(e),
                          logs="see the rank's output above") from None
    except _compat.signal_exception_type() as e:
        if getattr(e, "sigval", None) == signal.SIGINT:
            raise KeyboardInterrupt("interrupted: every worker process was stopped") from None
        raise
