"""What travels from the launching process to every rank, and how a rank puts it to use.

The same in both launchers: the caller serialises the call (function and arguments) once with
cloudpickle, so a function, closure or class defined in a notebook cell travels by value, and an
argument that cannot travel is named before any process starts. Around it, a `Payload` carries what
the rank needs to behave as if it ran in the caller (environment, import path, working directory) and
the launch's decisions (torch backend, device, threads, whether rank 0's bars are drawn). A rank calls
`Payload.apply` before it unpickles the call, so modules found through the caller's import path load.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle

from helpers.context import BACKEND_ENV, NODE_ENV
from helpers.launch.errors import RankFailedError
from helpers.launch.options import LaunchError
from helpers.progress import PROGRESS_DIR_ENV, PROGRESS_SWITCH_ENV

# The kinds of rank, one `RankSetup` each (below): a rank of the local launcher, a rank of the local launcher
# running another environment's interpreter (launch option python=), a Ray Train worker.
_LOCAL, _OTHER_PYTHON, _RAY = "local", "other python", "ray"
# The variables a rank keeps as its own instead of taking the caller's value, and the kinds of rank that do:
# the torch environment every launcher sets per rank; torch elastic's own; what Ray or the Ray launcher sets
# per worker; the Python environment of a rank running another environment's interpreter.
KEPT_BY: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "OMP_NUM_THREADS"), (_LOCAL, _OTHER_PYTHON, _RAY)),
    **dict.fromkeys(("GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                     "TORCH_NCCL_ASYNC_ERROR_HANDLING"), (_LOCAL, _OTHER_PYTHON)),
    **dict.fromkeys(("NODE_RANK", "CUDA_VISIBLE_DEVICES", "ACCELERATE_TORCH_DEVICE", "PWD", NODE_ENV),
                    (_RAY,)),
    **dict.fromkeys(("PATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
                     "PYTHONEXECUTABLE", "__PYVENV_LAUNCHER__"), (_OTHER_PYTHON,)),
}


def _kept(kind: str) -> frozenset[str]:
    return frozenset(name for name, kinds in KEPT_BY.items() if kind in kinds)


@dataclass(frozen=True)
class RankSetup:
    """How one kind of rank takes on the caller's state (`Payload.apply`): what it keeps, what it takes."""

    kind: str
    kept: frozenset[str]  # variables the rank keeps as its own: the caller's copies never replace them
    kept_prefixes: tuple[str, ...]  # the same, by prefix
    caller_values_win: bool  # True: the caller's values replace the rank's; False: they fill in what it lacks
    import_path: str  # CALLERS_PATH, CALLERS_MISSING_FIRST or FOREIGN_FIRST (below)
    own_interpreter_first: bool = False  # VIRTUAL_ENV and PATH name this interpreter's environment

    def __post_init__(self) -> None:
        if self.import_path not in IMPORT_PATH_MODES:
            raise ValueError(f"import_path={self.import_path!r}: use one of {IMPORT_PATH_MODES}")


CALLERS_PATH = "the caller's import path replaces the rank's"
CALLERS_MISSING_FIRST = "the caller's entries missing here go in front of the rank's own"
FOREIGN_FIRST = "the caller's entries outside its environment go in front of the rank's own"
IMPORT_PATH_MODES = (CALLERS_PATH, CALLERS_MISSING_FIRST, FOREIGN_FIRST)

# The local launcher's ranks are forked from a forkserver holding a snapshot of this machine taken when it
# started, possibly many cells ago: what the notebook set since must reach the rank, so the caller wins.
LOCAL_RANKS = RankSetup(_LOCAL, _kept(_LOCAL), ("TORCHELASTIC_",), caller_values_win=True,
                        import_path=CALLERS_PATH)
# A local rank with another environment's interpreter keeps that environment's packages and tools (its
# `bin` first on PATH) and takes the caller's other import paths (the notebook's folder, the project).
OTHER_PYTHON_RANKS = RankSetup(_OTHER_PYTHON, _kept(_OTHER_PYTHON), ("TORCHELASTIC_",),
                               caller_values_win=True, import_path=FOREIGN_FIRST, own_interpreter_first=True)
# A Ray worker may run on another node: its own values stay (its PATH, HOME, library and site-packages paths
# are right for it); the caller's fill in what the node lacks.
RAY_WORKERS = RankSetup(_RAY, _kept(_RAY), ("RAY_", "TORCHELASTIC_"), caller_values_win=False,
                        import_path=CALLERS_MISSING_FIRST)


_PLAIN_DATA = ("Pass plain data (numbers, strings, lists, dicts, numpy arrays, CPU tensors) and build open "
               "files, locks, sockets, process groups or CUDA objects inside the function.")


def serialise_call(fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> bytes:
    """cloudpickle `(fn, args, kwargs)`, or raise a LaunchError naming what cannot travel."""
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as e:
        parts = [("the function", fn), *((f"argument {i}", a) for i, a in enumerate(args)),
                 *((f"argument {k!r}", v) for k, v in kwargs.items())]
        for name, value in parts:
            try:
                cloudpickle.dumps(value)
            except Exception as inner:
                raise LaunchError(f"{name} ({type(value).__name__}) cannot be sent to the worker processes: "
                                  f"{inner}. {_PLAIN_DATA}") from inner
        raise LaunchError(f"the launch payload cannot be serialised: {e}") from e


def serialise_result(fn: Any, rank: int, result: Any) -> bytes:
    """cloudpickle a rank's return value, or say what to return instead."""
    try:
        return cloudpickle.dumps(result)
    except Exception as e:
        raise TypeError(
            f"the return value of {getattr(fn, '__name__', fn)!r} on rank {rank} cannot be serialised "
            f"({type(e).__name__}: {e}). Return plain Python values, numpy arrays or CPU tensors "
            "(call .cpu() / .item()), not open files, locks, process groups or CUDA handles."
        ) from e


@dataclass(frozen=True)
class Payload:
    call: bytes  # serialise_call's bytes: unpickled in the rank only after `apply`
    backend: str  # torch.distributed backend the rank should use (worker_context().backend)
    device: str  # "cuda" (one GPU per rank, by LOCAL_RANK) or "cpu"
    threads: int | None  # torch threads per rank; None leaves the worker's default
    progress: bool  # the caller draws rank 0's bars
    env: dict[str, str]  # the caller's environment at launch time
    sys_path: tuple[str, ...]
    cwd: str
    # the caller's environment prefixes (sys.prefix, sys.base_prefix): a rank whose interpreter lives in
    # another environment (launch option python=) keeps its own packages, and takes the caller's other paths
    prefixes: tuple[str, ...] = ()
    verbose: bool = False  # a verbose launch: rank 0 says when the group restarts (helpers.launch.decisions)

    @classmethod
    def capture(cls, call: bytes, *, backend: str, device: str, threads: int | None,
                progress: bool, verbose: bool = False) -> Payload:
        """The payload for this launch, with the caller's environment, import path and folder as they are
        now."""
        return cls(call=call, backend=backend, device=device, threads=threads, progress=progress,
                   verbose=verbose, env=dict(os.environ), sys_path=tuple(sys.path), cwd=os.getcwd(),
                   prefixes=tuple(dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix))))

    def in_other_environment(self) -> bool:
        """True in a rank started with another environment's interpreter than the caller's."""
        return bool(self.prefixes) and os.path.realpath(sys.prefix) != self.prefixes[0]

    def foreign_paths(self) -> list[str]:
        """The caller's import path without its environment's packages: project folders, the notebook's."""
        def inside(path: str, prefix: str) -> bool:
            return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)

        return [p for p in self.sys_path
                if not any(inside(os.path.realpath(p or "."), prefix) for prefix in self.prefixes)]

    def to_bytes(self) -> bytes:
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def from_bytes(data: bytes) -> Payload:
        payload = pickle.loads(data)
        if not isinstance(payload, Payload):
            raise TypeError(f"not a launch payload: {type(payload).__name__}")
        return payload

    def local_setup(self) -> RankSetup:
        """A local launcher's rank: LOCAL_RANKS, or OTHER_PYTHON_RANKS under another environment's python."""
        return OTHER_PYTHON_RANKS if self.in_other_environment() else LOCAL_RANKS

    def apply(self, setup: RankSetup, progress_dir: str | Path | None = None) -> None:
        """Make this rank see what the caller sees, as `setup` says, then set it up as the launch decided.

        `progress_dir` is where rank 0 writes its bar states when the caller draws them through files;
        otherwise bars go through the Ray relay (if any) or, when nobody draws them, are switched off
        so that rank 0 never falls back to tqdm in its log.
        """
        self._take_environment(setup)
        self._take_import_path(setup)
        with contextlib.suppress(OSError):
            os.chdir(self.cwd)
        # The kernel's inline matplotlib backend means nothing in a worker; plots belong on the driver.
        os.environ["MPLBACKEND"] = "Agg"
        os.environ[BACKEND_ENV] = self.backend
        self._route_progress(progress_dir)
        self._set_threads_and_device()

    def _take_environment(self, setup: RankSetup) -> None:
        for key, value in self.env.items():
            if key in setup.kept or key.startswith(setup.kept_prefixes):
                continue
            if setup.caller_values_win:
                os.environ[key] = value
            else:
                os.environ.setdefault(key, value)
        if setup.own_interpreter_first:  # the tools it starts (torchrun, compilers' wrappers) come from here
            os.environ["VIRTUAL_ENV"] = sys.prefix
            os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), self.env.get("PATH", "")])

    def _take_import_path(self, setup: RankSetup) -> None:
        if setup.import_path == CALLERS_PATH:
            sys.path[:] = self.sys_path
        elif setup.import_path == FOREIGN_FIRST:
            sys.path[:] = [*dict.fromkeys([*self.foreign_paths(), *sys.path])]
        else:  # CALLERS_MISSING_FIRST
            for path in reversed(self.sys_path):
                if path not in sys.path:
                    sys.path.insert(1, path)

    def _route_progress(self, progress_dir: str | Path | None) -> None:
        if self.progress and progress_dir is not None:
            os.environ[PROGRESS_DIR_ENV] = str(progress_dir)
        else:
            os.environ.pop(PROGRESS_DIR_ENV, None)
            if not self.progress:
                os.environ[PROGRESS_SWITCH_ENV] = "off"

    def _set_threads_and_device(self) -> None:
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
            # and in the environment, where libraries look (accelerate warns and sets 1 when it is unset)
            os.environ["OMP_NUM_THREADS"] = str(self.threads)
        if self.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        else:
            # A CPU launch on a GPU machine: code that picks the accelerator itself (FSDP2's default mesh,
            # accelerate, Lightning's "auto") would take cuda:LOCAL_RANK, which rank 1 of a 1-GPU machine
            # lacks. Hidden before anything initialises CUDA in this process, the GPUs do not exist for it.
            os.environ["CUDA_VISIBLE_DEVICES"] = ""

    def load_call(self) -> tuple[Callable[..., Any], tuple, dict[str, Any]]:
        """Unpickle the call (which imports what it needs), then move every object alive so far out of the
        garbage collector's sight (`gc.freeze`).

        A rank that has imported torch, transformers, TRL or DeepSpeed holds hundreds of thousands of objects
        that live as long as it does, and every full collection walks them all. Libraries call `gc.collect()`
        often (accelerate's `free_memory` at every `Trainer.train`, DeepSpeed's ZeRO set-up) and Python runs
        full collections by itself while a training loop allocates. Frozen, those objects are skipped; what
        the function creates is collected as usual. `benchmarks/rank_gc.py` measures a full collection with
        and without the freeze.
        """
        fn, args, kwargs = cloudpickle.loads(self.call)
        gc.freeze()
        return fn, args, kwargs


def load_results(stored: Mapping[int, bytes], world_size: int) -> list[Any]:
    """Every rank's return value, in rank order, from what the ranks stored (serialise_result's bytes)."""
    missing = [rank for rank in range(world_size) if rank not in stored]
    if missing:
        raise RankFailedError(f"rank {missing[0]} finished without storing a return value", rank=missing[0],
                              world_size=world_size)
    return [cloudpickle.loads(stored[rank]) for rank in range(world_size)]


def destroy_leftover_process_group() -> None:
    """After the function returned: a process group it forgot to destroy must not warn at the next launch."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
