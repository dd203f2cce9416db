"""What a launch decided, told when asked: `verbose=True` on a launch, or GALLERY_VERBOSE=1 for every launch.

Every module of the package logs through its own `logging.getLogger(__name__)`, at INFO: the plan (processes,
device, torch backend), the rendezvous port, the threads per rank, a restart. None of it shows otherwise, in a
notebook or anywhere: the package's logger (`helpers.launch`) keeps its records to itself (a NullHandler, and
no propagation to the root logger, where a library's `logging.basicConfig` would print them). A verbose launch
shows them on stderr, prefixed `[launcher] `, while it runs; `logging.getLogger("helpers.launch").propagate =
True` hands them to an application's own logging configuration instead.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from helpers.env import project_flag

PACKAGE_LOGGER = logging.getLogger("helpers.launch")
PACKAGE_LOGGER.addHandler(logging.NullHandler())
PACKAGE_LOGGER.propagate = False
PREFIX = "[launcher] "

log = logging.getLogger(__name__)


def verbose_everywhere() -> bool:
    """GALLERY_VERBOSE: every launch verbose, as if each had `verbose=True`."""
    return bool(project_flag("VERBOSE"))


@contextlib.contextmanager
def shown(verbose: bool) -> Iterator[None]:
    """With `verbose`, the package's records go to this process's stderr for the block; otherwise nowhere."""
    if not verbose:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(PREFIX + "%(message)s"))
    level = PACKAGE_LOGGER.level
    PACKAGE_LOGGER.addHandler(handler)
    PACKAGE_LOGGER.setLevel(logging.INFO)
    try:
        yield
    finally:
        PACKAGE_LOGGER.removeHandler(handler)
        PACKAGE_LOGGER.setLevel(level)


def tell_restart(rank: int, attempt: int, verbose: bool) -> None:
    """In a rank: rank 0 of a restarted group says so on a verbose launch (the restart is otherwise quiet)."""
    if verbose and attempt > 0 and rank == 0:
        with shown(True):
            log.info("restart: attempt %d of the group starts, after a rank of the last one failed", attempt)
