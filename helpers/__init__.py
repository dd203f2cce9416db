"""distributed-gallery helpers: the notebook launcher, offline data sets, and the gallery runner.

`helpers.launch` is the launcher's package; its `launch(fn, args, kwargs, options)` function is
`helpers.launch.launch`.
"""

from helpers import _quiet, cpus
from helpers.context import WorkerContext, worker_context
from helpers.launch import (
    DistributedFunction,
    LaunchError,
    LaunchOptions,
    LaunchPlan,
    RankError,
    RankFailedError,
    distributed,
    plan_launch,
    preload,
    ray_session,
)
from helpers.metrics import record_metrics
from helpers.progress import progress_bar
from helpers.reference import check_against_reference

_quiet.install()
cpus.fit_torch_threads()   # torch ignores a container's CPU quota; this process's own work would exceed it

__all__ = [
    "DistributedFunction",
    "LaunchError",
    "LaunchOptions",
    "LaunchPlan",
    "RankError",
    "RankFailedError",
    "WorkerContext",
    "check_against_reference",
    "distributed",
    "plan_launch",
    "preload",
    "progress_bar",
    "ray_session",
    "record_metrics",
    "worker_context",
]
