"""distributed-gallery helpers: the notebook launcher, offline data sets, and the gallery runner."""

from helpers.context import WorkerContext, worker_context
from helpers.launcher import (
    DistributedFunction,
    LaunchError,
    LaunchOptions,
    LaunchPlan,
    RankFailedError,
    distributed,
    launch,
)
from helpers.metrics import record_metrics
from helpers.progress import progress_bar
from helpers.reference import check_against_reference

__all__ = [
    "DistributedFunction",
    "LaunchError",
    "LaunchOptions",
    "LaunchPlan",
    "RankFailedError",
    "WorkerContext",
    "check_against_reference",
    "distributed",
    "launch",
    "progress_bar",
    "record_metrics",
    "worker_context",
]
