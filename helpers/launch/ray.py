"""The Ray launcher: run a notebook function as Ray Train workers.

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

* which cluster: an existing `ray.init()` in this process is always used (and left running), then the cluster
  `RAY_ADDRESS` names. Otherwise `cluster="ray"` starts a private local Ray instance (dashboard off, token
  authentication with a fresh token, temporary files under a short /tmp path) and shuts it down afterwards,
  leaving no Ray process; `cluster="auto"` connects to the cluster Ray finds (`RAY_ADDRESS`, or a local `ray
  start`); any other string is an address for `ray.init(address=...)`. A connection the launcher opened is
  closed again.
* `processes="auto"` means every GPU of the cluster (else 2 CPU workers); `device="auto"` uses GPUs when
  the cluster has any. Each worker reserves one CPU (and one GPU on GPU runs); the workers are placed by
  Ray, possibly on several machines, so `LOCAL_RANK`/`LOCAL_WORLD_SIZE` count the workers per machine
  (Ray Train groups them by IP address: simulated nodes on one machine count as one).
  `train.plan()` still describes the local launch; it does not ask the cluster.
* `threads_per_process`: Ray sets `OMP_NUM_THREADS` to the worker's CPUs (1); pass a number to change it.
* the caller's environment and import path only fill in what a worker's node lacks (its own values stay);
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
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from helpers.context import NODE_ENV
from helpers.env import temporary_environ
from helpers.launch import _compat
from helpers.launch.decisions import tell_restart
from helpers.launch.errors import RankExceptionRecord, RankExitStatus, job_failure
from helpers.launch.options import (
    DEFAULT_CPU_PROCESSES,
    RAY,
    LaunchOptions,
    LaunchPlan,
    check_options,
    launch_progress_view,
    plan_launch,
    plan_threads,
)
from helpers.launch.payload import (
    RAY_WORKERS,
    Payload,
    destroy_leftover_process_group,
    load_results,
    serialise_call,
    serialise_result,
)
from helpers.launch.ray_instance import ray_session
from helpers.progress import relay_ray_progress

log = logging.getLogger(__name__)
_POLL_SECONDS = 0.2


# --------------------------------------------------------------------------------------- the collector


class _Collector:
    """A Ray actor that carries logs, return values and failures from the workers to the driver.

    Ray Train v2 gives the driver no per-rank return values, and its log forwarding prefixes lines with
    process ids rather than ranks; an actor works across machines where a shared file would not.
    """

    def __init__(self) -> None:
        self._lines: list[tuple[int, str, str]] = []
        self._results: dict[int, bytes] = {}
        self._failures: list[RankExceptionRecord] = []
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

    def put_failure(self, failure: RankExceptionRecord) -> None:
        self._failures.append(failure)

    def collected(self) -> tuple[dict[int, bytes], list[RankExceptionRecord]]:
        return self._results, self._failures


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


@contextlib.contextmanager
def _output_forwarded(collector: Any, rank: int) -> Iterator[None]:
    """print() and sys.stdout / sys.stderr go to the collector, line by line, for the block."""
    import builtins

    streams = sys.stdout, sys.stderr, builtins.print
    builtins.print = _compat.ray_original_print()
    sys.stdout = _ForwardingStream(collector, rank, "stdout", streams[0])
    sys.stderr = _ForwardingStream(collector, rank, "stderr", streams[1])
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr, builtins.print = streams


def _worker_loop(config: dict[str, Any]) -> None:
    """The Ray Train `train_loop_per_worker`: set up the rank, run the user's function, report back."""
    import ray
    import ray.train

    collector = config["collector"]
    rank = ray.train.get_context().get_world_rank()
    attempt = ray.get(collector.start.remote(rank))
    payload = Payload.from_bytes(ray.get(config["payload"]))
    payload.apply(RAY_WORKERS)
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
    os.environ[NODE_ENV] = ray.get_runtime_context().get_node_id()

    def shard(value: Any) -> Any:
        return ray.train.get_dataset_shard(value.name) if isinstance(value, _DatasetShard) else value

    with _output_forwarded(collector, rank):
        tell_restart(rank, attempt, payload.verbose)
        try:
            fn, args, kwargs = payload.load_call()
            result = fn(*[shard(a) for a in args], **{k: shard(v) for k, v in kwargs.items()})
            data = serialise_result(fn, rank, result)
        except BaseException as exc:
            sys.stdout.flush()
            sys.stderr.flush()
            # Recorded before Ray sees the failure, so the driver can rebuild it.
            ray.get(collector.put_failure.remote(RankExceptionRecord.capture(exc, rank, attempt)))
            raise
    ray.get(collector.put_result.remote(rank, data))
    destroy_leftover_process_group()


# ---------------------------------------------------------------------------------------- the driver


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


def _print_lines(lines: list[tuple[int, str, str]], prefix: str) -> None:
    for rank, stream, text in lines:
        out = sys.stderr if stream == "stderr" else sys.stdout
        tag = prefix.replace("${rank}", str(rank))
        body = "".join(tag + line for line in text.splitlines(keepends=True))
        out.write(body if body.endswith("\n") else body + "\n")
    if lines:
        sys.stdout.flush()
        sys.stderr.flush()


def _exit_status(error: BaseException) -> RankExitStatus:
    """What Ray Train says of the first worker that failed (`WorkerGroupError.worker_failures`)."""
    failures = getattr(error, "worker_failures", None) or {}
    rank = min(failures) if failures else None
    cause = failures[rank] if failures else error
    detail = f"{type(cause).__name__}: {cause}"
    first = detail.strip().splitlines()[0] if detail.strip() else detail
    return RankExitStatus(rank=rank, detail=first)


@contextlib.contextmanager
def _printing_rank_output(ray: Any, collector: Any, prefix: str) -> Iterator[None]:
    """Print what the ranks sent to the collector, from a thread, until the block ends (and once after)."""
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                _print_lines(ray.get(collector.drain.remote()), prefix)
            stop.wait(_POLL_SECONDS)

    printer = threading.Thread(target=pump, name="helpers-ray-logs", daemon=True)
    printer.start()
    try:
        yield
    finally:
        stop.set()
        printer.join()
        with contextlib.suppress(Exception):
            _print_lines(ray.get(collector.drain.remote()), prefix)


def launch(fn: Callable[..., Any], args: tuple = (), kwargs: dict[str, Any] | None = None,
           options: LaunchOptions | None = None) -> list[Any]:
    """Run `fn(*args, **kwargs)` as Ray Train workers and return each rank's return value, in rank order.

    Called by `helpers.launch.launch` when `options.cluster` is set; see the module docstring for what
    is the same as the local launcher and what differs.
    """
    options = options or LaunchOptions(cluster="ray")
    check_options(options, RAY)
    view_wanted = launch_progress_view(options) is not None
    args, kwargs, datasets = _take_datasets(args, kwargs or {})
    call = serialise_call(fn, args, kwargs)  # an argument that cannot travel fails before Ray starts
    cpus_needed = options.processes if isinstance(options.processes, int) else DEFAULT_CPU_PROCESSES

    quiet_env = {} if options.verbose else _compat.RAY_QUIET_ENV
    with temporary_environ(quiet_env, keep_existing=quiet_env), \
            ray_session(options.cluster, cpus_needed, options.verbose) as ray:
        gpus = int(ray.cluster_resources().get("GPU", 0)) if options.device in ("auto", "cuda") else 0
        plan = plan_launch(options, gpus=gpus, target=RAY)
        threads = plan_threads(options, plan, target=RAY)
        payload = Payload.capture(call, backend=plan.backend, device=plan.device, threads=threads,
                                  progress=view_wanted, verbose=options.verbose)
        _log_plan(plan, threads)
        run_dir = Path(options.log_dir) if options.log_dir else Path(tempfile.mkdtemp(prefix="helpers-ray-"))
        collector = ray.remote(num_cpus=0)(_Collector).remote()
        loop_config = {"collector": collector, "payload": ray.put(payload.to_bytes())}
        trainer = _trainer(plan, options, loop_config, run_dir, datasets)
        error: BaseException | None = None
        try:
            with _printing_rank_output(ray, collector, options.prefix), relay_ray_progress(view_wanted):
                trainer.fit()  # rank 0's progress_bar is drawn here by the relay
        except KeyboardInterrupt:
            raise KeyboardInterrupt("interrupted: the Ray Train run was stopped") from None
        except Exception as e:  # TrainingFailedError and friends: rebuilt below from what the ranks sent
            error = e
        finally:
            try:
                results, failures = ray.get(collector.collected.remote())
            finally:
                with contextlib.suppress(Exception):
                    ray.kill(collector)
                if not options.log_dir:
                    shutil.rmtree(run_dir, ignore_errors=True)
        if error is not None:
            raise job_failure(failures, plan.processes, _exit_status(error),
                              logs="Ray's logs are in the session folder") from None
        return load_results(results, plan.processes)


def _log_plan(plan: LaunchPlan, threads: int | None) -> None:
    log.info("plan: %d Ray Train workers, device %s, torch backend %s", plan.processes, plan.device,
             plan.backend)
    log.info("threads per process: %s", threads or "Ray's (OMP_NUM_THREADS = the worker's CPUs)")
    log.info("rendezvous: rank 0's address and a free port there, chosen by Ray Train as the workers start")


def _trainer(plan: LaunchPlan, options: LaunchOptions, loop_config: dict[str, Any], run_dir: Path,
             datasets: dict[str, Any]) -> Any:
    """Ray Train's TorchTrainer for the plan: `_worker_loop` on every worker, checkpoints under `run_dir`."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    return TorchTrainer(
        _worker_loop,
        train_loop_config=loop_config,
        torch_config=_compat.env_only_torch_config(plan.backend),
        scaling_config=ScalingConfig(num_workers=plan.processes, use_gpu=plan.device == "cuda"),
        run_config=RunConfig(
            name=f"helpers-{uuid.uuid4().hex[:8]}", storage_path=str(run_dir.resolve()),
            failure_config=FailureConfig(max_failures=options.max_restarts),
            checkpoint_config=CheckpointConfig(num_to_keep=None),
        ),
        datasets=datasets or None,
    )
