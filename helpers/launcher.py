"""Run a function written in a notebook cell on every GPU of this machine, or on several CPU processes.

Built on torch's own elastic launcher (`torch.distributed.launcher.api.elastic_launch`): it gives the
workers the standard environment (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
`MASTER_ADDR`, `MASTER_PORT`) so DDP, FSDP, DeepSpeed, Lightning, accelerate and Streaming work
inside unchanged, restarts the group on failure (`max_restarts`) and stops every rank when one dies.
What this module adds is what a notebook needs on top of it:

* the function and its arguments travel with cloudpickle (closures and notebook classes work), through
  a file, so large arguments never block a pipe;
* workers come from a forkserver that has torch pre-loaded: nothing is forked from a kernel that may
  have touched CUDA, and a re-run starts in a fraction of torchrun's time;
* a rank's exception comes back as the same exception type, naming the rank, with its traceback;
* an interrupt (kernel stop) stops the workers and gives the kernel its signal handlers back;
* bad arguments fail before any process starts.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, ParamSpec, TypeVar

import cloudpickle

from helpers import _worker
from helpers._env import temporary_environ
from helpers.cpus import threads_per_rank
from helpers.progress import ProgressView, progress_view, watch_progress_dir

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_CPU_PROCESSES = 2
_HANDLED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")


class LaunchError(ValueError):
    """The launch was refused before any process started (bad arguments)."""


class RankFailedError(RuntimeError):
    """A rank died without a Python exception we could bring back (killed by a signal, for example)."""

    def __init__(self, message: str, rank: int | None = None, exitcode: int | None = None):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode


@dataclass(frozen=True)
class LaunchOptions:
    """How to launch. Every field can be changed per call with `fn.options(...)`."""

    processes: int | str = "auto"
    device: str = "auto"  # "auto" (GPUs if any), "cuda" or "cpu"
    backend: str | None = None  # None: nccl on GPUs, gloo on CPU
    max_restarts: int = 0
    start_method: str = "forkserver"
    master_addr: str = "127.0.0.1"
    stop_timeout: float = 10.0  # seconds a stopping rank gets before SIGKILL
    threads_per_process: int | None = None  # None: the CPU cores shared out between CPU ranks
    log_dir: str | None = None  # keep each launch's per-rank logs here (default: removed afterwards)
    prefix: str = "[rank${rank}] "
    # None: this machine (torch elastic). "ray": Ray Train workers on the ray.init() of this process, else on
    # a private local Ray instance started and stopped around the call; "auto" or an address such as
    # "ray://head:10001": that Ray cluster. See helpers.ray_launcher for what differs on a cluster.
    cluster: str | None = None
    # Rank 0's helpers.progress_bar drawn in this process: None (automatic: in Jupyter or a terminal),
    # True, or False. HELPERS_PROGRESS=off turns it off everywhere.
    progress: bool | None = None


@dataclass(frozen=True)
class LaunchPlan:
    processes: int
    device: str
    backend: str


def _gpu_count() -> int:
    import torch

    # device_count() asks NVML where it can, without creating a CUDA context in the kernel.
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_launch(options: LaunchOptions) -> LaunchPlan:
    """Turn the user's options into a concrete (processes, device, backend), or say what to change."""
    device = options.device
    if device not in ("auto", "cuda", "cpu"):
        raise LaunchError(f"device={device!r} is not one of 'auto', 'cuda', 'cpu'.")
    gpus = _gpu_count() if device in ("auto", "cuda") else 0
    if device == "cuda" and gpus == 0:
        raise LaunchError("device='cuda' but this machine has no usable GPU: use device='cpu' (gloo) or 'auto'.")
    if device == "auto":
        device = "cuda" if gpus else "cpu"

    processes = options.processes
    if processes == "auto":
        processes = gpus if device == "cuda" else DEFAULT_CPU_PROCESSES
    elif isinstance(processes, bool) or not isinstance(processes, int):
        raise LaunchError(
            f"processes={processes!r} is not a whole number: pass an int such as processes=2, "
            "or processes='auto' (every GPU, else 2 CPU processes)."
        )
    if processes < 1:
        raise LaunchError(f"processes={processes} must be at least 1: pass processes=1 or more, or 'auto'.")
    if device == "cuda" and processes > gpus:
        raise LaunchError(
            f"processes={processes} asks for one GPU per process but this machine has {gpus} GPU(s): "
            f"pass processes={gpus} (or 'auto'), or device='cpu' to run {processes} CPU processes with gloo."
        )

    backend = options.backend or ("nccl" if device == "cuda" else "gloo")
    if backend not in ("nccl", "gloo", "mpi", "xccl", "ucc"):
        raise LaunchError(f"backend={backend!r} is not a torch.distributed backend: use 'nccl' or 'gloo'.")
    if not isinstance(options.max_restarts, int) or options.max_restarts < 0:
        raise LaunchError(f"max_restarts={options.max_restarts!r} must be a whole number >= 0.")
    if options.progress is not None and not isinstance(options.progress, bool):
        raise LaunchError(f"progress={options.progress!r}: use True, False, or None (automatic).")
    if options.start_method not in ("forkserver", "spawn"):
        raise LaunchError(
            f"start_method={options.start_method!r}: use 'forkserver' (fast re-runs) or 'spawn'. "
            "'fork' is refused: forking a kernel that has touched CUDA breaks the children."
        )
    return LaunchPlan(processes=processes, device=device, backend=backend)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now, so two launches (or two kernels) never share a rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launch_progress_view(options: LaunchOptions) -> ProgressView | None:
    """Where this launch draws rank 0's progress bar (None: nowhere); a bad HELPERS_PROGRESS fails here."""
    try:
        return progress_view(options.progress)
    except ValueError as e:
        raise LaunchError(str(e)) from None


def _serialise_payload(fn: Callable, args: tuple, kwargs: dict, plan: LaunchPlan, threads: int | None,
                       progress: bool = False) -> bytes:
    payload = {
        "fn": fn, "args": args, "kwargs": kwargs, "backend": plan.backend, "device": plan.device,
        "threads": threads, "env": dict(os.environ), "sys_path": list(sys.path), "cwd": os.getcwd(),
        "progress": progress,
    }
    try:
        return cloudpickle.dumps(payload)
    except Exception as e:
        # Find the culprit so the message can name it.
        for name, value in [("the function", fn)] + [(f"argument {i}", a) for i, a in enumerate(args)] + [
            (f"argument {k!r}", v) for k, v in kwargs.items()
        ]:
            try:
                cloudpickle.dumps(value)
            except Exception as inner:
                raise LaunchError(
                    f"{name} ({type(value).__name__}) cannot be sent to the worker processes: {inner}. "
                    "Pass plain data (numbers, strings, lists, dicts, numpy arrays, CPU tensors) and build "
                    "open files, locks, sockets, process groups or CUDA objects inside the function."
                ) from inner
        raise LaunchError(f"the launch payload cannot be serialised: {e}") from e


_FORKSERVER_READY = False


def _prepare_forkserver(start_now: bool = False) -> None:
    """Ask the forkserver to import torch (through the worker module) once, before its first fork.

    With start_now, the server process starts at once and imports torch while the notebook goes on
    (the decorator calls this), so the first launch a few cells later finds it warm.
    """
    global _FORKSERVER_READY
    if not _FORKSERVER_READY:
        # Spinning OpenMP threads steal the cores of the other ranks on a CPU launch; libgomp reads this
        # once, when the forkserver imports torch, so it is set before the server starts.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        # Only torch by default: every extra module delays the first launch by its import time (torch._dynamo
        # ~0.7 s, DCP ~0.3 s), which is what a cold launch pays. Notebooks that launch many times with FSDP,
        # DeepSpeed or Lightning (which import dynamo lazily in every rank) can add them: HELPERS_PRELOAD=
        # "torch._dynamo,torch.distributed.checkpoint" before the first @distributed.
        extra = [m.strip() for m in os.environ.get("HELPERS_PRELOAD", "").split(",") if m.strip()]
        multiprocessing.get_context("forkserver").set_forkserver_preload(["helpers._worker", *extra])
        _FORKSERVER_READY = True
    if start_now:
        from multiprocessing import forkserver

        with contextlib.suppress(Exception):  # a failure here only costs the head start
            forkserver.ensure_running()


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
    """The agent logs every failure at length; we re-raise it in a shorter, more useful form."""
    if verbose:
        yield
        return
    names = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _rebuild_exception(record: dict[str, Any], world_size: int) -> BaseException:
    rank, tb = record["rank"], record["traceback"]
    header = f"rank {rank} of {world_size} raised {record['type_name']}: {record['message']}"
    message = f"{header}\n\n--- remote traceback (rank {rank}) ---\n{tb.rstrip()}"
    original = None
    if record.get("exception") is not None:
        with contextlib.suppress(Exception):
            original = cloudpickle.loads(record["exception"])
    if original is None:
        exc: BaseException = RankFailedError(message, rank=rank)
    else:
        try:
            exc = type(original)(message)
        except Exception:  # a constructor with other arguments: keep the object, add the context as a note
            exc = original
            exc.add_note(message)
    exc.rank = rank  # type: ignore[attr-defined]
    exc.remote_traceback = tb  # type: ignore[attr-defined]
    return exc


def _failure_from_run(run_dir: Path, rank: int | None, failure: Any, world_size: int) -> BaseException:
    """Pick the root-cause rank (the earliest exception of the last attempt) and rebuild its exception."""
    records = []
    for path in run_dir.glob("error-*.pkl"):
        with contextlib.suppress(Exception):
            records.append(cloudpickle.loads(path.read_bytes()))
    if records:  # after elastic restarts, what ended the job is the last attempt's failure
        last = max(r.get("attempt", 0) for r in records)
        records = [r for r in records if r.get("attempt", 0) == last]
    # Ranks that failed because a peer died (broken collectives) raise later than the peer did.
    interrupted = [r for r in records if r["type_name"] == "KeyboardInterrupt"]
    real = [r for r in records if r["type_name"] != "KeyboardInterrupt"] or interrupted
    if real:
        return _rebuild_exception(min(real, key=lambda r: r["time"]), world_size)
    # No Python exception anywhere: a rank was killed (OOM killer, SIGKILL, segfault).
    exitcode, signame = None, None
    if failure is not None:
        exitcode = failure.exitcode
        signame = failure.signal_name() if exitcode is not None and exitcode < 0 else None
    if signame:
        what = f"was killed by signal {signame} (exit code {exitcode})"
    else:
        what = f"exited with code {exitcode} without raising a Python exception"
    return RankFailedError(
        f"rank {rank} of {world_size} {what}. If it ran out of memory, lower the batch size or the "
        "number of processes; see the rank's output above.", rank=rank, exitcode=exitcode,
    )


class DistributedFunction(Generic[P, R]):
    """A function that runs in-process when called, and on every rank through `.distributed(...)`."""

    def __init__(self, fn: Callable[P, R], options: LaunchOptions):
        self._fn = fn
        self._options = options
        functools.update_wrapper(self, fn)

    @property
    def launch_options(self) -> LaunchOptions:
        return self._options

    def options(self, **changes: Any) -> DistributedFunction[P, R]:
        """A copy with other launch options, e.g. `train.options(processes=4).distributed(cfg)`."""
        unknown = set(changes) - set(LaunchOptions.__dataclass_fields__)
        if unknown:
            raise LaunchError(
                f"unknown launch option(s) {sorted(unknown)}; known: {sorted(LaunchOptions.__dataclass_fields__)}"
            )
        return DistributedFunction(self._fn, replace(self._options, **changes))

    def plan(self) -> LaunchPlan:
        """What `.distributed()` would start here: (processes, device, backend), checked."""
        return plan_launch(self._options)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run in this process as rank 0 of a world of 1, for debugging with the same code."""
        port = str(free_port())
        single = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                  "HELPERS_DIST_BACKEND": plan_launch(replace(self._options, processes=1)).backend}
        try:
            with temporary_environ(single, keep_existing=set(single) - {"MASTER_PORT"}):
                return self._fn(*args, **kwargs)
        finally:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dist.destroy_process_group()

    def distributed(self, *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Run on every rank; return each rank's return value, in rank order."""
        return launch(self._fn, args, kwargs, self._options)


def launch(fn: Callable[..., R], args: tuple = (), kwargs: dict | None = None,
           options: LaunchOptions | None = None, verbose: bool = False) -> list[R]:
    """Launch `fn(*args, **kwargs)` on every rank with torch elastic and collect the return values."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    options = options or LaunchOptions()
    kwargs = kwargs or {}
    if options.cluster is not None:  # Ray Train workers; it checks its arguments and the payload first
        from helpers.ray_launcher import launch_on_ray

        return launch_on_ray(fn, args, kwargs, options, verbose=verbose)
    plan = plan_launch(options)
    threads = options.threads_per_process
    if threads is None and plan.device == "cpu":
        try:  # the CPUs this process may use (affinity, container quota), not the host's count
            threads = threads_per_rank(plan.processes)
        except ValueError as e:
            raise LaunchError(str(e)) from None
    view = launch_progress_view(options)
    payload = _serialise_payload(fn, args, kwargs, plan, threads, view is not None)  # fails here, before any process

    run_dir = Path(tempfile.mkdtemp(prefix="helpers-launch-"))
    keep_logs = options.log_dir is not None
    log_root = Path(options.log_dir) if keep_logs else run_dir / "logs"
    payload_path = run_dir / "payload.pkl"
    payload_path.write_bytes(payload)
    if options.start_method == "forkserver":
        _prepare_forkserver()

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=plan.processes,
        run_id=f"helpers-{uuid.uuid4().hex[:12]}",
        # One machine: a static rendezvous over a c10d TCPStore on a fresh loopback port. The dynamic
        # c10d rendezvous would add a random 0-0.3 s join delay to every launch, meant for many nodes.
        rdzv_backend="static", rdzv_endpoint=f"{options.master_addr}:{free_port(options.master_addr)}",
        rdzv_configs={"rank": 0, "timeout": 60}, local_addr=options.master_addr,
        max_restarts=options.max_restarts, monitor_interval=0.05, start_method=options.start_method,
        logs_specs=DefaultLogsSpecs(log_dir=str(log_root), redirects=Std.ALL, tee=Std.ALL),
        log_line_prefix_template=options.prefix,
        shutdown_timeout=int(max(1, options.stop_timeout)),
    )
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    try:
        with _kernel_signal_handlers_kept(), _quiet_elastic_logs(verbose), _main_module_not_rerun(), \
                watch_progress_dir(run_dir / _worker.PROGRESS_FOLDER, view):
            try:
                elastic_launch(config, _worker.run)(str(payload_path), str(run_dir))
            except ChildFailedError as e:
                rank, first = e.get_first_failure()
                raise _failure_from_run(run_dir, rank, first, plan.processes) from None
            except SignalException as e:
                if e.sigval == signal.SIGINT:
                    raise KeyboardInterrupt("interrupted: every worker process was stopped") from None
                raise
        results = []
        for rank in range(plan.processes):
            path = _worker.result_path(run_dir, rank)
            if not path.exists():
                raise RankFailedError(f"rank {rank} finished without storing a return value", rank=rank)
            results.append(cloudpickle.loads(path.read_bytes()))
        return results
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        shutil.rmtree(run_dir, ignore_errors=True)


def distributed(fn: Callable[P, R] | None = None, **options: Any) -> Any:
    """Decorate a function so that `fn.distributed(...)` runs it on every rank.

    `@distributed` or `@distributed(processes=2, device="cpu", max_restarts=1, ...)`; see LaunchOptions.
    Options are checked now, so a typo fails at the decorator, not at the launch.
    """
    unknown = set(options) - set(LaunchOptions.__dataclass_fields__)
    if unknown:
        raise LaunchError(
            f"unknown launch option(s) {sorted(unknown)}; known: {sorted(LaunchOptions.__dataclass_fields__)}"
        )
    opts = LaunchOptions(**options)
    if opts.cluster is None and opts.start_method == "forkserver" and multiprocessing.current_process().name == "MainProcess":
        _prepare_forkserver(start_now=True)

    def wrap(f: Callable[P, R]) -> DistributedFunction[P, R]:
        return DistributedFunction(f, opts)

    return wrap(fn) if fn is not None else wrap
