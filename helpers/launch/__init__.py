"""Run a function written in a notebook cell on every GPU of this machine, on several CPU processes, or
on a Ray cluster.

    @distributed(processes=2)                  # or cluster="ray" / "auto" / "ray://head:10001"
    def train(cfg): ...
    results = train.distributed(cfg)           # one return value per rank, in rank order

The modules import one way: this one (the public API, and the dispatch on `cluster`) -> the launchers
`local` (torch elastic, with `local_worker` running in each rank and `forkserver_output` in the
forkserver the ranks fork from) and `ray` (Ray Train) -> the core they
share: `options` (the one validator: options and the machine's facts into a plan), `payload` (what
travels to a rank and how the rank applies it), `errors` (a rank's failure, its root cause, the
exception the caller gets) and `_compat` (every private torch, Ray or standard-library API used);
`ray_instance` (its `ray_session`) opens and closes a Ray connection or a private local instance;
`decisions` holds the package's loggers, shown only on a verbose launch.

Importing this package prepares the process for launching, in the notebook's kernel and in every rank
alike: torch's thread pool is sized to the CPUs this container may use (torch reads the host's cores and
would oversubscribe a quota), and two import-time notices of PEFT's dependencies are dropped (helpers.logs).
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic, ParamSpec, TypeVar

from helpers import cpus, logs
from helpers.context import BACKEND_ENV
from helpers.env import temporary_environ
from helpers.launch import local
from helpers.launch import ray as ray_launcher
from helpers.launch.decisions import shown, verbose_everywhere
from helpers.launch.errors import RankError, RankFailedError
from helpers.launch.local import preload
from helpers.launch.options import (
    LaunchError,
    LaunchOptions,
    LaunchPlan,
    check_option_names,
    check_options,
    plan_launch,
)
from helpers.launch.ray_instance import ray_session
from helpers.shared_storage import SharedPaths, shared_paths

logs.drop_import_notices()
cpus.fit_torch_threads()

P = ParamSpec("P")
R = TypeVar("R")

__all__ = [
    "DistributedFunction", "LaunchError", "LaunchOptions", "LaunchPlan", "RankError", "RankFailedError",
    "check_options", "distributed", "launch", "plan_launch", "preload", "ray_session",
]


class DistributedFunction(Generic[P, R]):
    """A function that runs in-process when called, and on every rank through `.distributed(...)`."""

    def __init__(self, fn: Callable[P, R], options: LaunchOptions):
        self._fn = fn
        self._options = options
        functools.update_wrapper(self, fn)

    def options(self, **changes: Any) -> DistributedFunction[P, R]:
        """A copy with other launch options, e.g. `train.options(processes=4).distributed(cfg)`."""
        check_option_names(changes)
        return DistributedFunction(self._fn, replace(self._options, **changes))

    def plan(self, *, gpus: int | None = None) -> LaunchPlan:
        """What `.distributed()` would start on this machine (or on one with `gpus` GPUs), checked."""
        return plan_launch(self._options, gpus=gpus)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Run in this process as rank 0 of a world of 1, for debugging with the same code."""
        single = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(local.free_port()),
                  BACKEND_ENV: plan_launch(replace(self._options, processes=1)).backend}
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


def launch(fn: Callable[..., R], args: tuple = (), kwargs: dict[str, Any] | None = None,
           options: LaunchOptions | None = None) -> list[R]:
    """Launch `fn(*args, **kwargs)` on every rank and collect the return values, in rank order.

    On this machine with torch elastic, or as Ray Train workers when `options.cluster` is set; each
    launcher checks its options and the payload before any process starts.
    """
    options = options or LaunchOptions()
    if verbose_everywhere():
        options = replace(options, verbose=True)
    launcher = local if options.cluster is None else ray_launcher
    with shown(options.verbose):
        if options.shared is None:
            return launcher.launch(fn, args, kwargs or {}, options)
        check_options(options)
        with shared_paths(**options.shared) as marked:
            return launcher.launch(SharedPathsChecked(fn, marked), args, kwargs or {}, options)


class SharedPathsChecked:
    """`fn`, preceded in every rank by the check of the paths the launch marked (the `shared` option)."""

    def __init__(self, fn: Callable[..., Any], marked: SharedPaths):
        self.fn, self.marked = fn, marked
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.marked.check()
        return self.fn(*args, **kwargs)


def distributed(fn: Callable[P, R] | None = None, **options: Any) -> Any:
    """Decorate a function so that `fn.distributed(...)` runs it on every rank.

    `@distributed` or `@distributed(processes=2, device="cpu", max_restarts=1, ...)`; see LaunchOptions.
    Option names are checked now, so a typo fails at the decorator, not at the launch.
    """
    check_option_names(options)
    opts = LaunchOptions(**options)
    if (opts.cluster is None and opts.start_method == "forkserver"
            and multiprocessing.current_process().name == "MainProcess"):
        local.prepare_forkserver(start_now=True)

    def wrap(f: Callable[P, R]) -> DistributedFunction[P, R]:
        return DistributedFunction(f, opts)

    return wrap(fn) if fn is not None else wrap
