"""The cluster path of the launcher: run a notebook function as Ray Train workers.

`@distributed(processes=4, cluster="ray")` (or `cluster="auto"`, or an address such as
`"ray://head:10001"`) runs the same decorated function that the local launcher runs, as the workers of a
`ray.train.torch.TorchTrainer` (`ScalingConfig(num_workers=processes, use_gpu=...)`), so it can span
several machines. What stays the same as on one machine:

* each rank's return value comes back, in rank order;
* what a rank prints (Python's `sys.stdout` / `sys.stderr`) appears live in the calling cell, prefixed
  `[rankN] ` (it travels through a small Ray actor, so it also works from other nodes);
* a rank that raises makes the call raise the same exception type, naming the rank, with its remote
  traceback; a rank that dies without an exception raises `RankFailedError`;
* the workers get the standard torch elastic environment (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
  `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), so `helpers.worker_context()` works, and, exactly as
  under torchrun, the function creates its process group itself (`dist.init_process_group(ctx.backend)`);
  Lightning, DeepSpeed and accelerate do it for you;
* `max_restarts=N` becomes Ray Train's `FailureConfig(max_failures=N)`; `TORCHELASTIC_RESTART_COUNT`
  tells a restarted rank which attempt it is.

What differs (Ray decides these, not us):

* which cluster: an existing `ray.init()` in this process is always used (and left running). Otherwise
  `cluster="ray"` starts a private local Ray instance (dashboard off, token authentication with a fresh
  token, temporary files under a short /tmp path) and shuts it down afterwards, leaving no Ray process;
  `cluster="auto"` connects to the cluster Ray finds (`RAY_ADDRESS`, or a local `ray start`); any other
  string is an address for `ray.init(address=...)`. A connection the launcher opened is closed again.
* `processes="auto"` means every GPU of the cluster (else 2 CPU workers); `device="auto"` uses GPUs when
  the cluster has any. Each worker reserves one CPU (and one GPU on GPU runs); the workers are placed by
  Ray, possibly on several machines, so `LOCAL_RANK`/`LOCAL_WORLD_SIZE` count the workers per node.
  `train.plan()` still describes the local launch; it does not ask the cluster.
* `threads_per_process`: Ray sets `OMP_NUM_THREADS` to the worker's CPUs (1); pass a number to change it.
* a `ray.data.Dataset` passed as an argument is handed to Ray Train (`datasets=`), and the rank receives
  its own shard instead (a `DataIterator`: call `.iter_torch_batches(...)`), so Ray Data streams the
  data to the workers instead of every rank receiving a copy.
* Ray Train's own API works inside the function (`ray.train.report`, `ray.train.get_checkpoint()`):
  checkpoints are written under `log_dir` (default: a temporary folder removed afterwards; on a real
  multi-node cluster, point `log_dir` at storage every node can reach).
* an interrupt (kernel stop) is handled by Ray Train, which aborts the run and stops its workers; a
  private instance is then shut down as well.
* output written below Python (C libraries writing to file descriptor 1/2) is not forwarded: it stays
  in Ray's log files (`log_to_driver` is off for a private instance).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle

from helpers._env import temporary_environ
from helpers._worker import serialise_result
from helpers.cpus import usable_cpus
from helpers.launcher import (
    LaunchError,
    LaunchOptions,
    RankFailedError,
    _rebuild_exception,
    launch_progress_view,
)
from helpers.progress import ENV_SWITCH, relay_ray_progress

DEFAULT_CPU_WORKERS = 2
_POLL_SECONDS = 0.2
# Environment the driver sets for the duration of a launch, and Ray Train propagates to its workers.
_RAY_QUIET_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",  # otherwise every ray.train.report() waits ~1.7 s
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",  # keep print() a print: we forward it ourselves
    "RAY_TRAIN_ENABLE_CONTROLLER_STRUCTURED_LOGGING": "0",
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",
    "RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",  # one actor (process) less per run
    "RAY_DEDUP_LOGS": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
}
# Variables Ray (or we) set per worker; the driver's copies must not replace them.
_WORKER_KEYS = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
    "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "ACCELERATE_TORCH_DEVICE", "TORCHELASTIC_RESTART_COUNT",
    "RAY_ADDRESS", "PWD",
}


# --------------------------------------------------------------------------------------- the collector


class _Collector:
    """A Ray actor that carries logs, return values and exceptions from the workers to the driver.

    Ray Train v2 gives the driver no per-rank return values, and its log forwarding prefixes lines with
    process ids rather than ranks; an actor works across machines where a shared file would not.
    """

    def __init__(self) -> None:
        self._lines: list[tuple[int, str, str]] = []
        self._results: dict[int, bytes] = {}
        self._errors: list[dict[str, Any]] = []
        self._starts: dict[int, int] = {}

    def start(self, rank: int) -> int:
        """Called by each rank when it starts; returns the attempt number (0, then 1 after a restart)."""
        attempt = self._starts.get(rank, -1) + 1
        self._starts[rank] = attempt
        self._results.pop(rank, None)
        return attempt

    def log(self, rank: int, stream: str, text: str) -> None:
        self._lines.append((rank, stream, text))

    def drain(self) -> list[tuple[int, str, str]]:
        lines, self._lines = self._lines, []
        return lines

    def put_result(self, rank: int, data: bytes) -> None:
        self._results[rank] = data

    def put_error(self, record: dict[str, Any]) -> None:
        self._errors.append(record)

    def collected(self) -> tuple[dict[int, bytes], list[dict[str, Any]], dict[int, int]]:
        return self._results, self._errors, self._starts


class _ForwardingStream:
    """A text stream that sends each complete line to the collector (and keeps partial lines)."""

    def __init__(self, collector: Any, rank: int, name: str, original: Any):
        self._collector, self._rank, self._name, self._original = collector, rank, name, original
        self._buffer = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._buffer += text
            if "\n" in self._buffer:
                complete, _, self._buffer = self._buffer.rpartition("\n")
                self._collector.log.remote(self._rank, self._name, complete + "\n")
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._buffer:
                self._collector.log.remote(self._rank, self._name, self._buffer)
                self._buffer = ""

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._original.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


# ------------------------------------------------------------------------------- inside each worker


class _DatasetShard:
    """Stands in the payload for a Ray Dataset argument; the worker swaps in its own shard."""

    def __init__(self, name: str):
        self.name = name


def _worker_loop(config: dict[str, Any]) -> None:
    """The Ray Train `train_loop_per_worker`: set up the rank, run the user's function, report back."""
    import builtins

    import ray
    import ray.train
    import torch

    collector = config["collector"]
    context = ray.train.get_context()
    rank = context.get_world_rank()
    attempt = ray.get(collector.start.remote(rank))
    payload = cloudpickle.loads(ray.get(config["payload"]))
    for key, value in payload["env"].items():
        if key not in _WORKER_KEYS and not key.startswith(("RAY_", "TORCHELASTIC_")):
            os.environ.setdefault(key, value)
    os.environ["MPLBACKEND"] = "Agg"
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
    os.environ["HELPERS_DIST_BACKEND"] = payload["backend"]
    if not payload.get("progress"):  # nobody draws rank 0's bars: never fall back to tqdm in the log
        os.environ[ENV_SWITCH] = "off"
    for path in reversed(payload["sys_path"]):  # the driver's import paths (the repo, the notebook folder)
        if path not in sys.path:
            sys.path.insert(1, path)
    with contextlib.suppress(OSError):
        os.chdir(payload["cwd"])
    if payload["threads"]:
        torch.set_num_threads(payload["threads"])
    if payload["device"] == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))

    def shard(value: Any) -> Any:
        return ray.train.get_dataset_shard(value.name) if isinstance(value, _DatasetShard) else value

    args = [shard(a) for a in payload["args"]]
    kwargs = {k: shard(v) for k, v in payload["kwargs"].items()}
    fn = payload["fn"]

    streams = sys.stdout, sys.stderr, builtins.print
    from ray.train.v2._internal.logging.patch_print import _original_print

    builtins.print = _original_print
    sys.stdout = _ForwardingStream(collector, rank, "stdout", streams[0])
    sys.stderr = _ForwardingStream(collector, rank, "stderr", streams[1])
    try:
        result = fn(*args, **kwargs)
        data = serialise_result(fn, rank, result)
    except BaseException as exc:
        sys.stdout.flush()
        sys.stderr.flush()
        record: dict[str, Any] = {
            "rank": rank, "attempt": attempt, "time": time.time(), "type_name": type(exc).__qualname__,
            "message": str(exc), "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        }
        try:
            record["exception"] = cloudpickle.dumps(exc)
        except Exception:
            record["exception"] = None
        ray.get(collector.put_error.remote(record))  # recorded before Ray sees the failure
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr, builtins.print = streams
    ray.get(collector.put_result.remote(rank, data))
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):  # as in the local launcher: no leftover group, no warning
            dist.destroy_process_group()


# --------------------------------------------------------------------- torch setup without a process group


def _env_only_torch_config(backend: str) -> Any:
    """A TorchConfig that gives the workers the torchrun environment but creates no process group.

    Ray Train's default calls `dist.init_process_group` before the function runs; the function written
    for the local launcher (or for torchrun) calls it itself, and a second call would fail.
    """
    from ray.train._internal.utils import get_address_and_port
    from ray.train.torch.config import TorchConfig, _set_torch_distributed_env_vars, _TorchBackend

    class _EnvOnlyTorchBackend(_TorchBackend):
        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            addr, port = worker_group.execute_single(0, get_address_and_port)

            def set_env(addr: str, port: int) -> None:
                os.environ["MASTER_ADDR"] = addr
                os.environ["MASTER_PORT"] = str(port)

            worker_group.execute(set_env, addr=addr, port=port)
            worker_group.execute(_set_torch_distributed_env_vars)

    class _EnvOnlyTorchConfig(TorchConfig):
        @property
        def backend_cls(self) -> type:
            return _EnvOnlyTorchBackend

    return _EnvOnlyTorchConfig(backend=backend)


# ---------------------------------------------------------------------------------------- the driver


def _check_options(options: LaunchOptions) -> None:
    if not isinstance(options.cluster, str) or not options.cluster.strip():
        raise LaunchError(
            f"cluster={options.cluster!r}: pass 'ray' (a private local Ray instance, or the ray.init() "
            "already made in this process), 'auto' (the cluster Ray finds) or an address such as "
            "'ray://head:10001'."
        )
    if options.device not in ("auto", "cuda", "cpu"):
        raise LaunchError(f"device={options.device!r} is not one of 'auto', 'cuda', 'cpu'.")
    processes = options.processes
    if processes != "auto" and (isinstance(processes, bool) or not isinstance(processes, int)):
        raise LaunchError(
            f"processes={processes!r} is not a whole number: pass an int such as processes=2, or 'auto' "
            "(every GPU of the cluster, else 2 CPU workers)."
        )
    if processes != "auto" and processes < 1:
        raise LaunchError(f"processes={processes} must be at least 1: pass processes=1 or more, or 'auto'.")
    if not isinstance(options.max_restarts, int) or options.max_restarts < 0:
        raise LaunchError(f"max_restarts={options.max_restarts!r} must be a whole number >= 0.")
    if options.backend not in (None, "nccl", "gloo"):
        raise LaunchError(f"backend={options.backend!r}: Ray Train workers use 'nccl' (GPUs) or 'gloo' (CPU).")
    if options.progress is not None and not isinstance(options.progress, bool):
        raise LaunchError(f"progress={options.progress!r}: use True, False, or None (automatic).")


def _take_datasets(args: tuple, kwargs: dict) -> tuple[tuple, dict, dict[str, Any]]:
    """Replace Ray Dataset arguments by named placeholders; return the datasets for the trainer."""
    data_module = sys.modules.get("ray.data")
    if data_module is None:
        return args, kwargs, {}
    datasets: dict[str, Any] = {}

    def take(name: str, value: Any) -> Any:
        if isinstance(value, data_module.Dataset):
            datasets[name] = value
            return _DatasetShard(name)
        return value

    new_args = tuple(take(f"arg{i}", a) for i, a in enumerate(args))
    new_kwargs = {k: take(k, v) for k, v in kwargs.items()}
    return new_args, new_kwargs, datasets


def _serialise(fn: Callable, args: tuple, kwargs: dict, backend: str, device: str, threads: int | None,
               progress: bool = False) -> bytes:
    from helpers.launcher import LaunchPlan, _serialise_payload

    plan = LaunchPlan(processes=1, device=device, backend=backend)
    return _serialise_payload(fn, args, kwargs, plan, threads, progress)


@contextlib.contextmanager
def ray_session(cluster: str = "ray", num_cpus: int | None = None, verbose: bool = False,
                log_to_driver: bool = False) -> Iterator[Any]:
    """Be connected to Ray for the duration of the block, and leave things as they were afterwards.

    An existing `ray.init()` is used as is. `cluster="ray"` otherwise starts a private local instance:
    dashboard off, logs not forwarded, a fresh authentication token in this process's environment (so
    nothing is written to ~/.ray), temporary files in a short /tmp folder (Ray's socket paths must stay
    under 107 characters), all stopped and removed on exit. `log_to_driver=True` forwards what the
    workers print, as Ray does by default (the launcher forwards it itself, with rank prefixes). Any other value is passed to
    `ray.init(address=...)` ("auto", "ray://host:10001", "host:6379") and disconnected on exit.
    """
    import ray

    if ray.is_initialized():
        yield ray
        return
    quiet: dict[str, Any] = {}
    if not verbose:  # Ray's INFO lines off in the driver; in the workers (logging_config) all but errors: without
        # the dashboard, Ray Train's placement-group cleaner warns every second that the state API is down
        quiet = {"logging_level": logging.WARNING, "log_to_driver": log_to_driver,
                 "logging_config": ray.LoggingConfig(log_level="ERROR")}
    if cluster != "ray" or os.environ.get("RAY_ADDRESS"):
        address = None if cluster == "ray" else cluster
        try:
            ray.init(address=address, **quiet)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise LaunchError(
                f"cluster={cluster!r}: could not connect to a Ray cluster ({type(e).__name__}: {e}). Start one "
                "(`ray start --head`), pass its address ('ray://host:10001'), or use cluster='ray' for a "
                "private local instance."
            ) from e
        try:
            yield ray
        finally:
            ray.shutdown()
        return

    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    auth = {}
    if not any(k in os.environ for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    cpus = max(usable_cpus(), num_cpus or 0)   # the container's CPUs, not the host's
    try:
        with temporary_environ(auth, keep_existing=auth):
            _refresh_auth_config(bool(auth))
            ray.init(num_cpus=cpus, include_dashboard=False, _temp_dir=temp_dir, **quiet)
            try:
                yield ray
            finally:
                ray.shutdown()
                _wait_for_ray_processes(temp_dir)
    finally:
        _refresh_auth_config(bool(auth))  # back to the user's own settings
        shutil.rmtree(temp_dir, ignore_errors=True)


def _refresh_auth_config(changed: bool) -> None:
    """Make Ray's C++ side re-read RAY_AUTH_MODE / RAY_AUTH_TOKEN (it caches them at first use).

    A new local instance would otherwise write a token to ~/.ray/auth_token; ours lives in this
    process's environment for the instance's lifetime, and its workers inherit it.
    """
    if not changed:
        return
    with contextlib.suppress(Exception):
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


def _ray_processes(temp_dir: str) -> list[int]:
    """Pids of processes started for the instance whose temporary folder is `temp_dir`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if temp_dir in cmdline and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids


def _wait_for_ray_processes(temp_dir: str, timeout: float = 10.0) -> None:
    """ray.shutdown() returns before every process of the instance has exited: wait, then kill stragglers."""
    import signal

    deadline = time.monotonic() + timeout
    while _ray_processes(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _ray_processes(temp_dir):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _cluster_gpus(ray: Any) -> int:
    return int(ray.cluster_resources().get("GPU", 0))


def _print_lines(lines: list[tuple[int, str, str]], prefix: str) -> None:
    for rank, stream, text in lines:
        out = sys.stderr if stream == "stderr" else sys.stdout
        tag = prefix.replace("${rank}", str(rank))
        body = "".join(tag + line for line in text.splitlines(keepends=True))
        out.write(body if body.endswith("\n") else body + "\n")
    if lines:
        sys.stdout.flush()
        sys.stderr.flush()


def _failure(error: BaseException, errors: list[dict[str, Any]], world_size: int) -> BaseException:
    """The root-cause exception of a failed run: the earliest one a rank raised in the last attempt."""
    if errors:
        last = max(r["attempt"] for r in errors)
        attempt = [r for r in errors if r["attempt"] == last]
        real = [r for r in attempt if r["type_name"] != "KeyboardInterrupt"] or attempt
        return _rebuild_exception(min(real, key=lambda r: r["time"]), world_size)
    failures = getattr(error, "worker_failures", None) or {}
    rank = min(failures) if failures else None
    detail = f"{type(failures[rank]).__name__}: {failures[rank]}" if failures else f"{type(error).__name__}: {error}"
    first = detail.strip().splitlines()[0] if detail.strip() else detail
    return RankFailedError(
        f"rank {rank} of {world_size} died without raising a Python exception ({first}). If it ran out of "
        "memory, lower the batch size or the number of processes; Ray's logs are in the session folder.",
        rank=rank,
    )


def launch_on_ray(fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
                  options: LaunchOptions | None = None, verbose: bool = False) -> list[Any]:
    """Run `fn(*args, **kwargs)` as Ray Train workers and return each rank's return value, in rank order.

    Called by `helpers.launcher.launch` when `options.cluster` is set; see the module docstring for what
    is the same as the local launcher and what differs.
    """
    options = options or LaunchOptions(cluster="ray")
    kwargs = kwargs or {}
    _check_options(options)
    view_wanted = launch_progress_view(options) is not None
    args, kwargs, datasets = _take_datasets(args, kwargs)
    # Fail on an unpicklable argument before anything starts. The device is settled once connected.
    _serialise(fn, args, kwargs, options.backend or "gloo", "cpu", options.threads_per_process)
    cpus_needed = options.processes if isinstance(options.processes, int) else DEFAULT_CPU_WORKERS

    with temporary_environ({} if verbose else _RAY_QUIET_ENV, keep_existing=_RAY_QUIET_ENV), ray_session(options.cluster, cpus_needed, verbose) as ray:
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        gpus = _cluster_gpus(ray) if options.device in ("auto", "cuda") else 0
        if options.device == "cuda" and gpus == 0:
            raise LaunchError("device='cuda' but the Ray cluster has no GPU: use device='cpu' (gloo) or 'auto'.")
        device = "cuda" if gpus and options.device != "cpu" else "cpu"
        processes = options.processes
        if processes == "auto":
            processes = gpus if device == "cuda" else DEFAULT_CPU_WORKERS
        if device == "cuda" and processes > gpus:
            raise LaunchError(
                f"processes={processes} asks for one GPU per worker but the Ray cluster has {gpus} GPU(s): "
                f"pass processes={gpus} (or 'auto'), or device='cpu'."
            )
        backend = options.backend or ("nccl" if device == "cuda" else "gloo")
        payload = _serialise(fn, args, kwargs, backend, device, options.threads_per_process, view_wanted)

        run_dir = Path(options.log_dir) if options.log_dir else Path(tempfile.mkdtemp(prefix="helpers-ray-"))
        collector = ray.remote(num_cpus=0)(_Collector).remote()
        payload_ref = ray.put(payload)
        trainer = TorchTrainer(
            _worker_loop,
            train_loop_config={"collector": collector, "payload": payload_ref},
            torch_config=_env_only_torch_config(backend),
            scaling_config=ScalingConfig(num_workers=processes, use_gpu=device == "cuda"),
            run_config=RunConfig(
                name=f"helpers-{uuid.uuid4().hex[:8]}", storage_path=str(run_dir.resolve()),
                failure_config=FailureConfig(max_failures=options.max_restarts),
                checkpoint_config=CheckpointConfig(num_to_keep=None),
            ),
            datasets=datasets or None,
        )

        stop = threading.Event()

        def pump() -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    _print_lines(ray.get(collector.drain.remote()), options.prefix)
                stop.wait(_POLL_SECONDS)

        printer = threading.Thread(target=pump, name="helpers-ray-logs", daemon=True)
        printer.start()
        error: BaseException | None = None
        try:
            with relay_ray_progress(view_wanted):  # rank 0's progress_bar, drawn here
                trainer.fit()
        except KeyboardInterrupt:
            raise KeyboardInterrupt("interrupted: the Ray Train run was stopped") from None
        except Exception as e:  # TrainingFailedError and friends: rebuilt below from what the ranks sent
            error = e
        finally:
            stop.set()
            printer.join()
            with contextlib.suppress(Exception):
                _print_lines(ray.get(collector.drain.remote()), options.prefix)
            try:
                results, errors, _ = ray.get(collector.collected.remote())
            finally:
                with contextlib.suppress(Exception):
                    ray.kill(collector)
                if not options.log_dir:
                    shutil.rmtree(run_dir, ignore_errors=True)
        if error is not None:
            raise _failure(error, errors, processes) from None
        missing = [r for r in range(processes) if r not in results]
        if missing:
            raise RankFailedError(f"rank {missing[0]} finished without storing a return value", rank=missing[0])
        return [cloudpickle.loads(results[r]) for r in range(processes)]
