"""The code that runs inside every worker process the launcher starts.

Kept apart from the launcher so that the forkserver can pre-load it (and torch with it) once per
kernel: a warm launch then forks a process that already has torch imported instead of paying for the
import again. The entry point takes only file paths, so the multiprocessing pickle never sees the
user's function: that goes through cloudpickle, which handles functions and classes defined in a
notebook cell.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import cloudpickle
import torch  # noqa: F401  (pre-loaded in the forkserver on purpose)

from helpers.progress import ENV_DIR, ENV_SWITCH

# Variables the elastic agent sets for each worker; the driver's copies (if any) must not replace them.
_ELASTIC_KEYS = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
}


PROGRESS_FOLDER = "progress"  # under the launch folder: rank 0's bar states (helpers.progress)


def result_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"result-{rank}.pkl"


def error_path(run_dir: str | Path, rank: int, attempt: int) -> Path:
    return Path(run_dir) / f"error-{rank}-attempt{attempt}.pkl"


def pid_path(run_dir: str | Path, rank: int, attempt: int) -> Path:
    return Path(run_dir) / f"pid-{rank}-attempt{attempt}"


def serialise_result(fn: Any, rank: int, result: Any) -> bytes:
    """cloudpickle the return value, or say what to return instead."""
    try:
        return cloudpickle.dumps(result)
    except Exception as e:
        raise TypeError(
            f"the return value of {getattr(fn, '__name__', fn)!r} on rank {rank} cannot be serialised "
            f"({type(e).__name__}: {e}). Return plain Python values, numpy arrays or CPU tensors "
            "(call .cpu() / .item()), not open files, locks, process groups or CUDA handles."
        ) from e


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _adopt_driver_environment(payload: dict[str, Any]) -> None:
    """Make the worker see what the notebook kernel sees now, not when the forkserver started."""
    for key, value in payload["env"].items():
        if key in _ELASTIC_KEYS or key.startswith("TORCHELASTIC_"):
            continue
        os.environ[key] = value
    # The kernel's inline matplotlib backend means nothing in a worker; plots belong on the driver.
    os.environ["MPLBACKEND"] = "Agg"
    sys.path[:] = payload["sys_path"]
    try:
        os.chdir(payload["cwd"])
    except OSError:
        pass


def _own_store_keys_per_attempt(attempt: int) -> None:
    """Give a restarted group its own keys in the agent's store.

    The elastic agent keeps one TCPStore across restarts (`max_restarts`), but torch's env://
    rendezvous no longer prefixes the workers' keys with the attempt, so a restarted group reads the
    dead group's addresses (gloo: "Connection refused", or a hang in init_process_group). Wrapping the
    env:// handler to prefix them by attempt, as torch itself once did, fixes it; the first attempt is
    left untouched.
    """
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    import importlib

    from torch.distributed import PrefixStore

    rdzv = importlib.import_module("torch.distributed.rendezvous")
    original = rdzv._rendezvous_handlers["env"]

    def env_handler(url: str, **kwargs: Any):
        for store, rank, world_size in original(url, **kwargs):
            yield PrefixStore(f"/helpers/attempt_{attempt}", store), rank, world_size

    rdzv._rendezvous_handlers["env"] = env_handler


def _record_failure(run_dir: str, rank: int, attempt: int, exc: BaseException) -> None:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    record: dict[str, Any] = {"rank": rank, "attempt": attempt, "time": time.time(), "traceback": tb,
                              "type_name": type(exc).__qualname__, "message": str(exc)}
    try:
        record["exception"] = cloudpickle.dumps(exc)
    except Exception:  # an exception holding something unpicklable: keep its text only
        record["exception"] = None
    try:
        _atomic_write(error_path(run_dir, rank, attempt), cloudpickle.dumps(record))
    except Exception:
        pass


def run(payload_path: str, run_dir: str) -> None:
    """Entry point of a worker: load the function, run it, store its return value or its exception."""
    for stream in (sys.stdout, sys.stderr):
        try:  # stdout goes to a file the launcher tails: flush every line so it shows up live
            stream.reconfigure(line_buffering=True)
        except AttributeError:
            pass
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    pid_path(run_dir, rank, attempt).write_text(str(os.getpid()))
    try:
        _run(payload_path, run_dir, rank, attempt)
    finally:
        # multiprocessing ends its children with os._exit(), which skips atexit handlers; libraries rely
        # on them to free resources (MosaicML Streaming unlinks its /dev/shm segments there). Run them now,
        # as a torchrun worker's normal interpreter exit would.
        atexit._run_exitfuncs()


def _run(payload_path: str, run_dir: str, rank: int, attempt: int) -> None:
    try:
        with open(payload_path, "rb") as f:
            payload = cloudpickle.load(f)
        _adopt_driver_environment(payload)
        threads = payload.get("threads")
        if threads:
            torch.set_num_threads(threads)
        os.environ["HELPERS_DIST_BACKEND"] = payload["backend"]
        if payload.get("progress"):  # the launching process draws rank 0's bars from this folder
            os.environ[ENV_DIR] = str(Path(run_dir) / PROGRESS_FOLDER)
        else:  # nobody draws them: never fall back to tqdm in this worker's log
            os.environ.pop(ENV_DIR, None)
            os.environ[ENV_SWITCH] = "off"
        _own_store_keys_per_attempt(attempt)
        if payload["device"] == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        fn = payload["fn"]
        result = fn(*payload["args"], **payload["kwargs"])
        _atomic_write(result_path(run_dir, rank), serialise_result(fn, rank, result))
    except BaseException as exc:
        _record_failure(run_dir, rank, attempt, exc)
        raise
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:  # a function that forgot destroy_process_group() must not leave the next launch a warning
            dist.destroy_process_group()
        except Exception:
            pass
