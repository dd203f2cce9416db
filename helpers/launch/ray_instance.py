"""A Ray connection for the length of a block: an existing `ray.init()` as it is, a named cluster, or a
private local instance started and stopped around the block, leaving no Ray process behind.

The Ray launcher runs inside one; notebooks that call Ray Train themselves (06) open their own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from helpers.cpus import usable_cpus
from helpers.env import temporary_environ
from helpers.launch import _compat
from helpers.launch.options import LaunchError
from helpers.logs import quieted


def import_ray() -> Any:
    """Import Ray and Ray Train without the two notes they print in a notebook that lacks ipywidgets.

    tqdm (imported by Ray) warns "IProgress not found", and `ray.widgets` logs "Missing packages:
    ['ipywidgets']", both about widgets that only Ray's own reprs and bars would use; the launcher draws
    rank 0's bar without widgets, so the notes ask a reader for a package nothing they run needs.
    """
    with quieted(("ray.widgets.util",), logging.WARNING), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        import ray
        import ray.train.torch  # noqa: F401  (its trainers check for widgets as they are defined)
    return ray


@contextlib.contextmanager
def ray_session(cluster: str = "ray", num_cpus: int | None = None, verbose: bool = False,
                log_to_driver: bool = False, worker_log_level: str = "ERROR",
                raylet_notices: bool = True) -> Iterator[Any]:
    """Be connected to Ray for the duration of the block, and leave things as they were afterwards.

    An existing `ray.init()` is used as is. `cluster="ray"` otherwise starts a private local instance:
    dashboard off, logs not forwarded, a fresh authentication token in this process's environment (so
    nothing is written to ~/.ray), temporary files in a short /tmp folder (Ray's socket paths must stay
    under 107 characters), all stopped and removed on exit. `log_to_driver=True` forwards what the
    workers print, as Ray does by default (the launcher forwards it itself, with rank prefixes). Any
    other value is passed to `ray.init(address=...)` ("auto", "ray://host:10001", "host:6379") and
    disconnected on exit. `num_cpus` raises a private instance's CPUs above the usable ones.
    `worker_log_level` is what Ray's libraries log in the workers ("CRITICAL" keeps even the error report
    of a worker whose peer was killed on purpose out of the cell; a failed run still raises on the driver),
    and `raylet_notices=False` drops the raylet's reports of dead workers, which name ids and addresses.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    quiet: dict[str, Any] = {}
    if not verbose:  # Ray's INFO lines off in the driver; in the workers (logging_config) all but errors:
        # without the dashboard, Ray Train's placement-group cleaner warns every second that the state API
        # is down
        quiet = {"logging_level": logging.WARNING, "log_to_driver": log_to_driver,
                 "logging_config": ray.LoggingConfig(log_level=worker_log_level)}
    if cluster != "ray" or os.environ.get("RAY_ADDRESS"):
        connection = _connected(ray, None if cluster == "ray" else cluster, quiet)
    else:
        connection = _private_instance(ray, num_cpus, quiet, None if verbose else worker_log_level)
    notices = contextlib.nullcontext() if raylet_notices else _compat.ray_raylet_notices_dropped()
    with connection, notices:
        yield ray


@contextlib.contextmanager
def _connected(ray: Any, address: str | None, quiet: dict[str, Any]) -> Iterator[None]:
    """Connected to the cluster at `address` (None: RAY_ADDRESS's) for the block, disconnected after."""
    try:
        with _native_stderr_kept() as native_stderr:
            ray.init(address=address, **quiet)
    except (ConnectionError, ValueError, RuntimeError, ray.exceptions.RayError) as e:
        raise LaunchError(connect_failure(address or "ray", e, native_stderr())) from e
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def _private_instance(ray: Any, num_cpus: int | None, quiet: dict[str, Any],
                      data_log_level: str | None) -> Iterator[None]:
    """A local Ray instance of this process's own for the block, then stopped with every process it started.

    `data_log_level`: what Ray Data logs in the actor that runs a dataset (None: Ray Data's default).
    """
    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    auth = {}
    if not any(k in os.environ for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    cpus = max(usable_cpus(), num_cpus or 0)  # the container's CPUs, not the host's
    # Ray Data logs every dataset's start and end at INFO in the actor that runs it (with a path of this
    # machine); its own config variable is the one switch that reaches that actor. A user's config wins.
    data_logging = {}
    if data_log_level is not None:
        data_logging = {"RAY_DATA_LOGGING_CONFIG": _ray_data_logging_config(temp_dir, data_log_level)}
    try:
        with temporary_environ({**auth, **data_logging}, keep_existing=[*auth, *data_logging]):
            if auth:  # ours lives in this process's environment for the instance's lifetime
                _compat.refresh_ray_auth()
            _compat.ray_init_with_temp_dir(ray, temp_dir, num_cpus=cpus, include_dashboard=False, **quiet)
            try:
                yield
            finally:
                ray.shutdown()
                _wait_for_ray_processes(temp_dir)
    finally:
        if auth:  # back to the user's own settings
            _compat.refresh_ray_auth()
        shutil.rmtree(temp_dir, ignore_errors=True)


AUTH_ADVICE = ("the cluster uses token authentication and this process has no token: set "
               "RAY_AUTH_MODE=token and the head's token (RAY_AUTH_TOKEN=<token>, or its ~/.ray/auth_token "
               "file copied here, or RAY_AUTH_TOKEN_PATH) in the environment that starts this notebook or "
               "process, then connect again (docs/cluster.md)")


def connect_failure(cluster: str, error: BaseException, native_stderr: str = "") -> str:
    """Why `ray.init(address=...)` failed, with the fix. Ray's Python error only says it could not connect;
    a head that refuses our missing token says so on the C++ client's stderr (InvalidAuthToken)."""
    text = f"{type(error).__name__}: {error}"
    if "InvalidAuthToken" in native_stderr or "Unauthenticated" in native_stderr \
            or type(error).__name__ == "AuthenticationError":
        return f"cluster={cluster!r}: could not connect to the Ray cluster ({text[:300]}): {AUTH_ADVICE}."
    return (f"cluster={cluster!r}: could not connect to a Ray cluster ({text}). Start one "
            "(`ray start --head`), pass its address ('ray://host:10001'), or use cluster='ray' for a private "
            "local instance.")


@contextlib.contextmanager
def _native_stderr_kept() -> Iterator[Any]:
    """Copy what Ray's C++ client writes to file descriptor 2 while connecting (a refused token appears only
    there), and pass it on to the real stderr afterwards, so nothing is lost. Yields a reader of the copy."""
    import sys

    copy = tempfile.TemporaryFile()
    text = ""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):   # no file descriptor 2 to borrow: connect as usual
        copy.close()
        yield lambda: ""
        return
    os.dup2(copy.fileno(), 2)
    try:
        yield lambda: text
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        copy.seek(0)
        captured = copy.read()
        copy.close()
        text = captured.decode(errors="replace")
        if captured:
            with contextlib.suppress(OSError):
                os.write(2, captured)


def _ray_data_logging_config(folder: str, level: str) -> str:
    """A logging config for Ray Data (`RAY_DATA_LOGGING_CONFIG`): `level` and above, to stderr only."""
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(name)s: %(message)s"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "level": level}},
        "loggers": {"ray.data": {"level": level, "handlers": ["console"], "propagate": False}},
    }
    path = Path(folder) / "ray_data_logging.json"   # JSON is YAML: Ray Data reads it with yaml.safe_load
    path.write_text(json.dumps(config))
    return str(path)


def _uses_folder(proc: Path, folder: str) -> bool:
    """Whether the process has `folder` on its command line or holds a file in it open."""
    try:
        if folder in (proc / "cmdline").read_bytes().decode(errors="replace"):
            return True
        return any(os.readlink(fd).startswith(folder) for fd in (proc / "fd").iterdir())
    except OSError:  # gone meanwhile, or not ours to look at
        return False


def _ray_processes(temp_dir: str) -> list[int]:
    """Pids of processes started for the instance whose temporary folder is `temp_dir`.

    Ray's own daemons name the folder on their command line; its workers rename themselves
    ("ray::TrainController") but write their output to log files in the folder. A worker that outlives
    its raylet is found that way too.
    """
    return [int(entry.name) for entry in Path("/proc").iterdir()
            if entry.name.isdigit() and int(entry.name) != os.getpid() and _uses_folder(entry, temp_dir)]


def _wait_for_ray_processes(temp_dir: str, timeout: float = 10.0) -> None:
    """ray.shutdown() returns before every process of the instance has exited: wait, then kill stragglers."""
    deadline = time.monotonic() + timeout
    while _ray_processes(temp_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _ray_processes(temp_dir):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
