"""The code that runs inside every worker process the local launcher starts.

Kept apart from the launcher so that the forkserver can pre-load it (and torch with it) once per
kernel: a warm launch then forks a process that already has torch imported instead of paying for the
import again. The entry point takes only file paths, so the multiprocessing pickle never sees the
user's function: that goes through cloudpickle, which handles functions and classes defined in a
notebook cell.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch  # noqa: F401  (pre-loaded in the forkserver on purpose)

from helpers.files import atomic_write
from helpers.launch import _compat
from helpers.launch.decisions import tell_restart
from helpers.launch.errors import RankExceptionRecord
from helpers.launch.payload import Payload, destroy_leftover_process_group, serialise_result

PROGRESS_FOLDER = "progress"  # under the launch folder: rank 0's bar states (helpers.progress)


def result_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / f"result-{rank}.pkl"


def stored_results(run_dir: str | Path, world_size: int) -> dict[int, bytes]:
    """{rank: its serialised return value} for every rank that stored one."""
    paths = {rank: result_path(run_dir, rank) for rank in range(world_size)}
    return {rank: path.read_bytes() for rank, path in paths.items() if path.exists()}


def failure_path(run_dir: str | Path, rank: int, attempt: int) -> Path:
    return Path(run_dir) / f"error-{rank}-attempt{attempt}.pkl"


def read_failures(run_dir: str | Path) -> list[RankExceptionRecord]:
    """Every failure the ranks of this launch recorded, all attempts; unreadable files are skipped."""
    paths = Path(run_dir).glob("error-*.pkl")
    records = (RankExceptionRecord.from_bytes(path.read_bytes()) for path in paths)
    return [r for r in records if r is not None]


def _exit_with(launcher_pid: int, interval: float = 1.0) -> None:
    """End this rank when the process that launched it is gone.

    The elastic agent lives in the launching process (a notebook kernel) and stops its ranks when the kernel
    stops them, or when a rank fails. A kernel that dies outright (killed, out of memory, a restart that does
    not wait) takes the agent with it, and nothing would stop ranks that block in a collective or train on:
    they would hold their CPUs, GPUs and ports until the machine reboots. This daemon thread notices.
    """
    import threading
    import time

    def watch() -> None:
        while True:
            time.sleep(interval)
            try:
                os.kill(launcher_pid, 0)   # signal 0: only asks whether the process exists
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:        # it exists (another user's process under a reused pid at worst)
                pass

    threading.Thread(target=watch, name="helpers-launcher-watch", daemon=True).start()


def run(payload_path: str, run_dir: str, launcher_pid: int | None = None) -> None:
    """Entry point of a worker: load the function, run it, store its return value or its exception."""
    if launcher_pid is not None:
        _exit_with(launcher_pid)
    for stream in (sys.stdout, sys.stderr):
        try:  # stdout goes to a file the launcher tails: flush every line so it shows up live
            stream.reconfigure(line_buffering=True)
        except AttributeError:
            pass
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    try:
        _run(payload_path, run_dir, rank, attempt)
    finally:
        # multiprocessing ends its children with os._exit(), which skips atexit handlers; libraries rely
        # on them to free resources (MosaicML Streaming unlinks its /dev/shm segments there). Run them now,
        # as a torchrun worker's normal interpreter exit would.
        _compat.run_exit_handlers()


def _run(payload_path: str, run_dir: str, rank: int, attempt: int) -> None:
    try:
        payload = Payload.from_bytes(Path(payload_path).read_bytes())
        payload.apply(payload.local_setup(), progress_dir=Path(run_dir) / PROGRESS_FOLDER)
        tell_restart(rank, attempt, payload.verbose)
        _compat.prefix_store_keys_by_attempt(attempt)
        fn, args, kwargs = payload.load_call()
        result = fn(*args, **kwargs)
        atomic_write(result_path(run_dir, rank), serialise_result(fn, rank, result))
    except BaseException as exc:
        try:
            record = RankExceptionRecord.capture(exc, rank, attempt)
            atomic_write(failure_path(run_dir, rank, attempt), record.to_bytes())
        except Exception:  # a full disk must not hide the rank's own exception
            pass
        raise
    destroy_leftover_process_group()


def main(argv: list[str] | None = None) -> None:
    """Entry point of a rank started as a command (launch option python=): `payload run_dir launcher_pid`."""
    payload_path, run_dir, launcher_pid = (argv if argv is not None else sys.argv[1:])[:3]
    run(payload_path, run_dir, int(launcher_pid))


def bootstrap_arguments(payload_path: str, run_dir: str, launcher_pid: int) -> tuple[str, ...]:
    """The command-line arguments of another interpreter's rank: find this package, then run `main`.

    The other environment needs neither this package installed nor anything on its PYTHONPATH: the rank puts
    this package's folder on its import path and then takes the caller's other paths from the payload.
    """
    root = str(Path(__file__).resolve().parents[2])
    code = (f"import sys; sys.path.insert(0, {root!r}); "
            "from helpers.launch.local_worker import main; main()")
    return ("-c", code, payload_path, run_dir, str(launcher_pid))
