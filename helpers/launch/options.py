"""Launch options, and the one validator that turns them and the machine's facts into a plan.

Both launchers (local and Ray) check options here, with the same rules and the same messages. What
differs between them is an explicit `Target` argument (which torch.distributed backends its workers can
use, what the messages call the place where the ranks run, whether the launcher shares the CPUs out between
ranks), and the machine's facts (GPU count, usable CPUs) are arguments that default to this machine's, so a
test or a notebook can ask what a launch would start on a machine with 8 GPUs without patching anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from helpers import progress
from helpers.cpus import threads_per_rank

# processes="auto" without GPUs: two ranks show every distributed effect and fit a 2-core machine.
DEFAULT_CPU_PROCESSES = 2


class LaunchError(ValueError):
    """The launch was refused before any process started (bad arguments); the message says what to change."""


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
    # None: this machine (torch elastic). "ray": Ray Train workers on the ray.init() of this process, else
    # on the cluster RAY_ADDRESS names, else on a private local Ray instance started and stopped around it;
    # "auto" or an address such as "ray://head:10001": that Ray cluster. See helpers.launch.ray for what
    # differs on a cluster.
    cluster: str | None = None
    # Rank 0's helpers.progress_bar drawn in this process: None (automatic: in Jupyter or a terminal),
    # True, or False. GALLERY_PROGRESS=off turns it off everywhere.
    progress: bool | None = None
    # The interpreter the ranks run with: None, this one; else another environment's python (its own
    # packages, this process's helpers), for a framework that cannot share the notebook's environment
    # (notebook 09: Axolotl). Local launcher only; a Ray cluster gives its workers a runtime_env instead.
    python: str | None = None
    # True: what the launcher decided (plan, port, threads, a restart: helpers.launch.decisions) and the
    # engines' own logs as they are (torch elastic's agent, Ray's INFO lines), for when a launch fails in a
    # way the short error does not explain. False: only what the ranks print, and the error. GALLERY_VERBOSE=1
    # makes every launch verbose.
    verbose: bool = False
    # Paths the ranks read or write, by name ({"output_dir": "/mnt/run", "data_path": ...}; None values
    # skipped): marked by this process around the launch and checked by every rank before the function runs,
    # so that on a cluster a path that is not on storage every node reaches fails at once, naming the rank,
    # its node and the path (helpers.shared_storage). On one machine the check always passes.
    shared: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class LaunchPlan:
    """What a launch starts, resolved against the machine (or cluster): how many ranks, on which device, with
    which torch backend. `fn.plan()` returns it without starting anything."""

    processes: int
    device: str
    backend: str


@dataclass(frozen=True)
class Target:
    """What one launcher (local or Ray) can run, as the validator needs to know it."""

    where: str  # the place the ranks run, as the messages name it
    backends: tuple[str, ...]  # torch.distributed backends its workers can use
    backend_refused: str  # the message for another backend, with {backend!r}
    shares_cpus: bool  # True: the launcher gives each CPU rank its share of the cores as torch threads


LOCAL = Target(
    where="this machine", backends=("nccl", "gloo", "mpi", "xccl", "ucc"),
    backend_refused="backend={backend!r} is not a torch.distributed backend: use 'nccl' or 'gloo'.",
    shares_cpus=True,
)
# Ray Train's TorchConfig sets up nccl or gloo only, and gives each worker its CPUs (OMP_NUM_THREADS).
RAY = Target(
    where="the Ray cluster", backends=("nccl", "gloo"),
    backend_refused="backend={backend!r}: Ray Train workers use 'nccl' (GPUs) or 'gloo' (CPU).",
    shares_cpus=False,
)

OPTION_NAMES = tuple(f.name for f in fields(LaunchOptions))


def target_of(options: LaunchOptions) -> Target:
    """The launcher a launch with these options goes to: this machine, or Ray when `cluster` is set."""
    return LOCAL if options.cluster is None else RAY


def gpu_count() -> int:
    """GPUs this process can use (0 without CUDA)."""
    import torch

    # device_count() asks NVML where it can, without creating a CUDA context in the kernel.
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_option_names(names: Iterable[str]) -> None:
    """Refuse a misspelt option at the decorator or at `.options()`, not at the launch."""
    unknown = set(names) - set(OPTION_NAMES)
    if unknown:
        raise LaunchError(f"unknown launch option(s) {sorted(unknown)}; known: {sorted(OPTION_NAMES)}")


def _whole_number(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_options(options: LaunchOptions, target: Target | None = None) -> None:
    """Every check that needs no fact about the machine; raises LaunchError naming the fix."""
    target = target or target_of(options)
    if options.cluster is not None and (not isinstance(options.cluster, str) or not options.cluster.strip()):
        raise LaunchError(
            f"cluster={options.cluster!r}: pass 'ray' (the ray.init() already made in this process, "
            "else RAY_ADDRESS's cluster, else a private local Ray instance), 'auto' (the cluster Ray finds) "
            "or an address such as 'ray://head:10001'."
        )
    if options.device not in ("auto", "cuda", "cpu"):
        raise LaunchError(f"device={options.device!r} is not one of 'auto', 'cuda', 'cpu'.")
    processes = options.processes
    if processes != "auto" and not _whole_number(processes):
        raise LaunchError(
            f"processes={processes!r} is not a whole number: pass an int such as processes=2, or "
            f"processes='auto' (every GPU of {target.where}, else {DEFAULT_CPU_PROCESSES} CPU processes)."
        )
    if processes != "auto" and processes < 1:
        raise LaunchError(f"processes={processes} must be at least 1: pass processes=1 or more, or 'auto'.")
    if options.backend is not None and options.backend not in target.backends:
        raise LaunchError(target.backend_refused.format(backend=options.backend))
    if not _whole_number(options.max_restarts) or options.max_restarts < 0:
        raise LaunchError(f"max_restarts={options.max_restarts!r} must be a whole number >= 0.")
    if options.threads_per_process is not None and (
            not _whole_number(options.threads_per_process) or options.threads_per_process < 1):
        raise LaunchError(f"threads_per_process={options.threads_per_process!r}: pass a whole number >= 1, "
                          "or None (the usable cores shared out between CPU ranks).")
    try:
        progress.check_enabled(options.progress)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if not isinstance(options.verbose, bool):
        raise LaunchError(f"verbose={options.verbose!r}: use True (the launchers' own logs too) or False.")
    if options.python is not None:
        check_interpreter(options.python, target)
    if options.shared is not None and (not isinstance(options.shared, Mapping)
                                       or not all(isinstance(k, str) for k in options.shared)):
        raise LaunchError(f"shared={options.shared!r}: pass a dict of name -> path, such as "
                          "{'output_dir': output_dir}, or None.")
    if options.start_method not in ("forkserver", "spawn"):
        raise LaunchError(
            f"start_method={options.start_method!r}: use 'forkserver' (fast re-runs) or 'spawn'. "
            "'fork' is refused: forking a kernel that has touched CUDA breaks the children."
        )


def check_interpreter(python: Any, target: Target) -> None:
    """`python=` must name an interpreter that exists, for a launch on this machine."""
    import os

    if target is not LOCAL:
        raise LaunchError(f"python={python!r} is for launches on this machine: on {target.where}, give the "
                          "workers their packages with a Ray runtime_env (or install them on every node).")
    if not isinstance(python, str) or not python.strip():
        raise LaunchError(f"python={python!r}: pass the path of another environment's interpreter, such as "
                          "'.venv-axolotl/bin/python', or None for this one.")
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise LaunchError(f"python={python!r} is not an executable file: build that environment first (for "
                          "notebook 09: `make venv-axolotl`), or pass None to run the ranks with this "
                          "interpreter.")


def plan_launch(options: LaunchOptions, *, gpus: int | None = None, target: Target = LOCAL) -> LaunchPlan:
    """Turn the options into a concrete (processes, device, backend), or say what to change.

    `gpus` is the number of GPUs of `target` (default: this machine's, asked only when the device may
    be a GPU); the Ray launcher passes the cluster's.
    """
    check_options(options, target)
    device = options.device
    if gpus is None:
        gpus = gpu_count() if device in ("auto", "cuda") else 0
    if device == "cuda" and gpus == 0:
        raise LaunchError(f"device='cuda' but {target.where} has no usable GPU: use device='cpu' (gloo) "
                          "or 'auto'.")
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    processes = options.processes
    if processes == "auto":
        processes = gpus if device == "cuda" else DEFAULT_CPU_PROCESSES
    if device == "cuda" and processes > gpus:
        raise LaunchError(
            f"processes={processes} asks for one GPU per process but {target.where} has {gpus} GPU(s): "
            f"pass processes={gpus} (or 'auto'), or device='cpu' to run {processes} CPU processes with gloo."
        )
    backend = options.backend or ("nccl" if device == "cuda" else "gloo")
    return LaunchPlan(processes=processes, device=device, backend=backend)


def plan_threads(options: LaunchOptions, plan: LaunchPlan, *, target: Target = LOCAL,
                 cpus: int | None = None) -> int | None:
    """torch threads for each rank, or None to leave the worker's default.

    An explicit `threads_per_process` wins. Otherwise CPU ranks of a target that shares the CPUs out
    get the usable cores (affinity mask and container quota, or `cpus`) divided between them, so two
    ranks on two cores do not thrash; `GALLERY_THREADS_PER_PROCESS` overrides that for every launch.
    """
    if options.threads_per_process is not None:
        return options.threads_per_process
    if not target.shares_cpus or plan.device != "cpu":
        return None
    try:
        return threads_per_rank(plan.processes, cpus=cpus)
    except ValueError as e:
        raise LaunchError(str(e)) from None


def launch_progress_view(options: LaunchOptions) -> progress.ProgressView | None:
    """Where this launch draws rank 0's progress bar (None: nowhere); a bad GALLERY_PROGRESS fails here."""
    try:
        return progress.view.progress_view(options.progress)  # one name to patch: tests record the bars
    except ValueError as e:
        raise LaunchError(str(e)) from None
