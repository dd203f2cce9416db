"""Every use of a private torch, Ray or standard-library API by the launchers, in one place.

Private names move without notice. Each use is declared here as a `PrivateAPI` entry (what, where,
why, and the version it was checked against) and resolved through `resolve`, both at run time and by
tests/test_compat.py, which resolves every entry against the installed versions: after an upgrade
that moved one, that test fails and names the entry, instead of a launch failing (or silently doing
less) in a notebook. No other module of helpers.launch touches a private name (a test checks that).

The torch entries were checked against torch 2.14.1, the Ray entries against Ray 2.60.0, the
standard-library ones against Python 3.11 (`TORCH`, `RAY`, `PYTHON` below).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


class CompatError(RuntimeError):
    """A private API this package relies on is not where it was: helpers/launch/_compat.py needs an update."""


# The versions every entry below was checked against.
TORCH, RAY, PYTHON = "2.14.1", "2.60.0", "3.11"


@dataclass(frozen=True)
class PrivateAPI:
    """One private name used here; the comment above its declaration says what for."""

    library: str  # "torch", "ray" or "python"
    module: str
    name: str  # attribute path inside the module, or (kind "text") a name the module's source must mention
    checked: str  # the library version this use was checked against
    # "attr": module.name must exist; "text": the module reads `name` (an environment variable, a keyword)
    kind: str = "attr"

    def describe(self) -> str:
        return f"{self.module}.{self.name}" if self.kind == "attr" else f"{self.name!r} read by {self.module}"


def _installed(library: str) -> str:
    if library == "python":
        import platform

        return platform.python_version()
    try:
        return importlib.import_module(library).__version__
    except Exception:
        return "not installed"


def resolve(api: PrivateAPI) -> Any:
    """The object `api` names (for kind "text": the name itself), or a CompatError saying what moved."""
    try:
        module = importlib.import_module(api.module)
        if api.kind == "text":
            if api.name not in inspect.getsource(module):
                raise LookupError(f"{api.module} no longer mentions {api.name!r}")
            return api.name
        value: Any = module
        for part in api.name.split("."):
            value = getattr(value, part)
        return value
    except Exception as e:
        raise CompatError(
            f"{api.library} {_installed(api.library)}: {api.describe()} moved or changed "
            f"({type(e).__name__}: {e}); it was checked against {api.library} {api.checked}. Update its "
            "entry in helpers/launch/_compat.py (the comment above it says what it is used for) for this "
            "version."
        ) from e


# ---------------------------------------------------------------------------------------------- torch

_RENDEZVOUS = "torch.distributed.rendezvous"
# Prefix a restarted group's store keys by attempt (max_restarts), so it never reads the dead group's.
RENDEZVOUS_HANDLERS = PrivateAPI("torch", _RENDEZVOUS, "_rendezvous_handlers", TORCH)
# Tell whether the ranks share the elastic agent's store across restarts.
AGENT_STORE_IN_USE = PrivateAPI("torch", _RENDEZVOUS, "_torchelastic_use_agent_store", TORCH)
# Recognise the kernel's interrupt (SIGINT) inside torch elastic's agent and raise KeyboardInterrupt.
SIGNAL_EXCEPTION = PrivateAPI("torch", "torch.distributed.elastic.multiprocessing.api", "SignalException",
                              TORCH)


def prefix_store_keys_by_attempt(attempt: int) -> None:
    """Give a restarted group its own keys in the elastic agent's store.

    The agent keeps one TCPStore across restarts (`max_restarts`), but torch's env:// rendezvous no longer
    prefixes the workers' keys with the attempt, so a restarted group reads the dead group's addresses
    (gloo: "Connection refused", or a hang in init_process_group). Wrapping the env:// handler to prefix
    them by attempt, as torch itself once did, fixes it; the first attempt is left untouched.
    """
    if attempt == 0 or not resolve(AGENT_STORE_IN_USE)():
        return
    from torch.distributed import PrefixStore

    handlers = resolve(RENDEZVOUS_HANDLERS)
    original = handlers["env"]

    def env_handler(url: str, **kwargs: Any) -> Iterator[Any]:
        for store, rank, world_size in original(url, **kwargs):
            yield PrefixStore(f"/helpers/attempt_{attempt}", store), rank, world_size

    handlers["env"] = env_handler


def signal_exception_type() -> type[BaseException]:
    return resolve(SIGNAL_EXCEPTION)


def launch_config_stop_grace(seconds: float) -> dict[str, int]:
    """`LaunchConfig(shutdown_timeout=...)`, a stopping rank's grace before SIGKILL, where torch has it.

    A public field, but a new one: it landed after torch 2.11's branch cut (pytorch PR 172596), and older
    agents wait a fixed 30 s. The GPU machine's torch may be such a version, so pass it only where it exists.
    """
    from torch.distributed.launcher.api import LaunchConfig

    if "shutdown_timeout" in getattr(LaunchConfig, "__dataclass_fields__", {}):
        return {"shutdown_timeout": int(max(1, seconds))}
    return {}


# ------------------------------------------------------------------------------------ standard library

# Run a worker's atexit handlers, which multiprocessing's os._exit() skips (Streaming frees /dev/shm there).
RUN_EXIT_FUNCS = PrivateAPI("python", "atexit", "_run_exitfuncs", PYTHON)
# Start the forkserver when a function is decorated, so it has imported torch by the launch cell.
FORKSERVER_ENSURE_RUNNING = PrivateAPI("python", "multiprocessing.forkserver", "ensure_running", PYTHON)


# Tell whether a module is being imported by the forkserver as it pre-loads: multiprocessing's `main` of the
# server runs below it on the stack (forkserver_output sends the server's own output to a file then).
FORKSERVER_MAIN = PrivateAPI("python", "multiprocessing.forkserver", "main", PYTHON)


def run_exit_handlers() -> None:
    resolve(RUN_EXIT_FUNCS)()


def start_forkserver() -> None:
    resolve(FORKSERVER_ENSURE_RUNNING)()


def in_forkserver_preload() -> bool:
    """Whether this runs inside multiprocessing's forkserver as it pre-loads its modules (its `main` is on the
    stack): the server imports them there, before it forks the first process."""
    server_main = resolve(FORKSERVER_MAIN).__code__
    frame = inspect.currentframe()
    while frame is not None:
        if frame.f_code is server_main:
            return True
        frame = frame.f_back
    return False


# ------------------------------------------------------------------------------------------------ Ray

# Give a Ray Train worker the real print(), so the launcher forwards what it prints with a rank prefix.
RAY_ORIGINAL_PRINT = PrivateAPI("ray", "ray.train.v2._internal.logging.patch_print", "_original_print", RAY)
# Find rank 0's address and a free port for MASTER_ADDR / MASTER_PORT.
RAY_ADDRESS_AND_PORT = PrivateAPI("ray", "ray.train._internal.utils", "get_address_and_port", RAY)
# Give Ray Train workers the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE...).
RAY_TORCH_ENV_VARS = PrivateAPI("ray", "ray.train.torch.config", "_set_torch_distributed_env_vars", RAY)
# Set the workers up as torchrun does without creating a process group the function creates itself.
RAY_TORCH_BACKEND = PrivateAPI("ray", "ray.train.torch.config", "_TorchBackend", RAY)
# Make Ray's C++ side re-read RAY_AUTH_MODE for a private instance's token.
RAY_AUTH_CONFIG = PrivateAPI("ray", "ray._raylet", "Config.initialize", RAY)
# Make Ray forget a cached token, so a private instance's token never goes to ~/.ray.
RAY_AUTH_TOKEN_LOADER = PrivateAPI("ray", "ray._raylet", "AuthenticationTokenLoader.instance", RAY)
# Keep a private instance's files under a short /tmp folder (Ray's socket paths must stay short).
RAY_TEMP_DIR = PrivateAPI("ray", "ray._private.worker", "_temp_dir", RAY, kind="text")
# The driver prints the raylet's notices (a worker died, with its ids and address) through this function;
# ray_session(raylet_notices=False) wraps it to drop those, and nothing else.
RAY_PRINT_TO_STDSTREAM = PrivateAPI("ray", "ray._private.worker", "print_to_stdstream", RAY)
# Ray's internal switches, set for the duration of a launch (Ray Train passes them on to its workers):
# {variable: (value, the module that reads it, why)}.
_RAY_SWITCHES = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": ("0.1", "train", "otherwise every ray.train.report() waits ~1.7 s"),
    "RAY_TRAIN_ENABLE_PRINT_PATCH": ("0", "train", "keep print() a print: the launcher forwards it itself"),
    "RAY_TRAIN_ENABLE_CONTROLLER_STRUCTURED_LOGGING": ("0", "train", "keep controller logs out of the cell"),
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": ("0", "train", "keep worker logs out of the cell"),
    "RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION": ("0", "train", "skip the state actor's reconciliation"),
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": ("0", "train", "start one actor (process) less per run"),
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": ("0", "core", "keep Ray from re-creating the environment with uv"),
}
_SWITCH_READERS = {"train": "ray.train.v2._internal.constants", "core": "ray._private.ray_constants"}
RAY_QUIET_SWITCHES = tuple(PrivateAPI("ray", _SWITCH_READERS[reader], name, RAY, kind="text")
                           for name, (_, reader, _) in _RAY_SWITCHES.items())
# Documented Ray and Tune settings, set for the same reason.
_RAY_PUBLIC_SWITCHES = {"RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0",
                        "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}
RAY_QUIET_ENV = {name: value for name, (value, _, _) in _RAY_SWITCHES.items()} | _RAY_PUBLIC_SWITCHES

PRIVATE_APIS: tuple[PrivateAPI, ...] = (
    RENDEZVOUS_HANDLERS, AGENT_STORE_IN_USE, SIGNAL_EXCEPTION, RUN_EXIT_FUNCS, FORKSERVER_ENSURE_RUNNING,
    FORKSERVER_MAIN,
    RAY_ORIGINAL_PRINT, RAY_ADDRESS_AND_PORT, RAY_TORCH_ENV_VARS, RAY_TORCH_BACKEND, RAY_AUTH_CONFIG,
    RAY_AUTH_TOKEN_LOADER, RAY_TEMP_DIR, RAY_PRINT_TO_STDSTREAM, *RAY_QUIET_SWITCHES,
)


def ray_original_print() -> Callable[..., None]:
    return resolve(RAY_ORIGINAL_PRINT)


def ray_init_with_temp_dir(ray: Any, temp_dir: str, **kwargs: Any) -> None:
    """`ray.init(**kwargs)` for a new local instance whose files go under `temp_dir`."""
    ray.init(**{resolve(RAY_TEMP_DIR): temp_dir}, **kwargs)


@contextlib.contextmanager
def ray_raylet_notices_dropped() -> Iterator[None]:
    """Drop what the raylet reports to the driver ("A worker died or was killed ...") while inside.

    Worker output is printed by another path and is unaffected. The raylet's notice names worker, node and
    job ids and the node's IP address; a lesson that kills a worker on purpose says what happened instead.
    """
    import ray._private.worker as ray_worker

    original = resolve(RAY_PRINT_TO_STDSTREAM)

    def without_raylet(data: Any, *args: Any, **kwargs: Any) -> None:
        if data.get("pid") != "raylet":
            original(data, *args, **kwargs)

    ray_worker.print_to_stdstream = without_raylet
    try:
        yield
    finally:
        ray_worker.print_to_stdstream = original


def refresh_ray_auth() -> None:
    """Make Ray's C++ side re-read RAY_AUTH_MODE / RAY_AUTH_TOKEN (it caches them at first use)."""
    with contextlib.suppress(Exception):  # an older Ray without token authentication: nothing to refresh
        resolve(RAY_AUTH_CONFIG)("")
        resolve(RAY_AUTH_TOKEN_LOADER)().reset_cache()


def env_only_torch_config(backend: str) -> Any:
    """A Ray Train TorchConfig that gives the workers the torchrun environment but creates no process group.

    Ray Train's default calls `dist.init_process_group` before the function runs; the function written
    for the local launcher (or for torchrun) calls it itself, and a second call would fail.
    """
    from ray.train.torch.config import TorchConfig

    get_address_and_port = resolve(RAY_ADDRESS_AND_PORT)
    set_torch_env_vars = resolve(RAY_TORCH_ENV_VARS)

    class _EnvOnlyTorchBackend(resolve(RAY_TORCH_BACKEND)):  # type: ignore[misc]
        def on_start(self, worker_group: Any, backend_config: Any) -> None:
            addr, port = worker_group.execute_single(0, get_address_and_port)

            def set_env(addr: str, port: int) -> None:
                os.environ["MASTER_ADDR"] = addr
                os.environ["MASTER_PORT"] = str(port)

            worker_group.execute(set_env, addr=addr, port=port)
            worker_group.execute(set_torch_env_vars)

    class _EnvOnlyTorchConfig(TorchConfig):
        @property
        def backend_cls(self) -> type:
            return _EnvOnlyTorchBackend

    return _EnvOnlyTorchConfig(backend=backend)
