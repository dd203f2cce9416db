"""A rank-0 training progress bar, drawn by the notebook that launched the ranks rather than by the rank.

Why not tqdm in the worker: what a worker prints reaches the notebook through a line-based log tail
(torch elastic's, or Ray's), so tqdm's carriage-return redraws arrive as a pile of half lines, or only
when the line finally ends. Here rank 0 sends the bar's state (a few hundred bytes, at most five times
a second) to the process that launched it, and that process draws it:

* in a Jupyter kernel as one display that is updated in place (IPython's `display_id`): no widgets
  needed, and JupyterLab, VS Code, nbclient and papermill all understand it (a stored notebook keeps
  the final state);
* in a terminal as a tqdm bar on stderr;
* nowhere else: a worker's own log never gets a bar, other ranks pay nothing.

How the state travels:

* local launcher (`helpers.distributed`): one small JSON file per bar in the launch folder, replaced
  atomically by rank 0 and polled by the launching process;
* Ray (`cluster="ray"`, or Ray Train directly inside `relay_ray_progress()`): an actor named
  `helpers-progress` in the job's namespace, which works across machines;
* no launcher (`train(cfg)` in-process, or torchrun in a terminal): drawn directly.

`GALLERY_PROGRESS=off` turns bars off everywhere; `GALLERY_PROGRESS=on` draws them in the launching process
even when stderr is not a terminal (a log file, a CI job). The launcher option `progress=False` turns them off
for one launch. A bar shows rates and times that change on every run, so the gallery tags each launching cell
`nbval-ignore-output` and nbval never compares it (tests/test_progress.py checks the tags).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar

from helpers.progress.settings import (
    MIN_INTERVAL,
    PROGRESS_DIR_ENV,
    PROGRESS_METADATA_KEY,
    PROGRESS_SWITCH_ENV,
    RELAY_NAME,
)
from helpers.progress.transports import relay_ray_progress, sink_for, watch_progress_dir
from helpers.progress.view import ProgressView, check_enabled, format_bar, progress_view

__all__ = ["MIN_INTERVAL", "PROGRESS_DIR_ENV", "PROGRESS_METADATA_KEY", "PROGRESS_SWITCH_ENV",
           "RELAY_NAME", "ProgressView", "RankProgress", "check_enabled", "format_bar", "progress_bar",
           "progress_view", "relay_ray_progress", "watch_progress_dir"]

T = TypeVar("T")
_counter = 0
_counter_lock = threading.Lock()


def _rank() -> int:
    """This process's global rank: torch elastic / torchrun / Ray Train set RANK; in-process it is 0."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        with contextlib.suppress(Exception):
            import ray.train

            return ray.train.get_context().get_world_rank()
    return 0


class RankProgress(Generic[T]):
    """A tqdm-like bar that is live on rank 0 and free on every other rank (see `progress_bar`)."""

    def __init__(self, iterable: Iterable[T] | None, total: float | None, desc: str, unit: str, active: bool,
                 initial: float = 0):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self._iterable = iterable
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = self.initial = initial
        self.postfix = ""
        self.closed = False
        self._sink = None
        self._start = time.monotonic()
        self._sent_at = -math.inf
        if active:
            global _counter
            with _counter_lock:
                _counter += 1
                self.id = f"{os.getpid()}:{_counter}"
            self._sink = sink_for(self.id)
            self._send(force=True)
        else:
            self.id = ""

    def __iter__(self) -> Iterator[T]:
        if self._iterable is None:
            raise TypeError("this progress bar wraps no iterable: call update(n) instead of iterating it")
        try:
            for item in self._iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> RankProgress[T]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        self._send()

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        """`loss=0.41, lr=3e-4`: floats shown to 4 significant digits, as tqdm does. `refresh=False` leaves
        sending to the next `update()`."""
        self.postfix = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                 for k, v in values.items())
        if refresh:
            self._send()

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self._send()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._send(force=True)

    def state(self) -> dict[str, Any]:
        return {"id": self.id, "desc": self.desc, "n": self.n, "total": self.total, "unit": self.unit,
                "initial": self.initial, "postfix": self.postfix, "elapsed": time.monotonic() - self._start,
                "closed": self.closed}

    def _send(self, force: bool = False) -> None:
        if self._sink is None:
            return
        now = time.monotonic()
        if not force and now - self._sent_at < MIN_INTERVAL:
            return
        self._sent_at = now
        try:
            self._sink(self.state())
        except Exception:  # a progress bar must never fail a training run
            self._sink = None


def progress_bar(iterable: Iterable[T] | None = None, total: float | None = None, desc: str = "",
                 unit: str = "it", *, initial: float = 0, rank: int | None = None) -> RankProgress[T]:
    """A progress bar for a training loop: rank 0's is drawn in the notebook cell that launched the ranks.

    Use it like tqdm: `for batch in progress_bar(loader, desc=f"epoch {e}")`, or
    `bar = progress_bar(total=steps)` with `bar.update()` and `bar.set_postfix(loss=...)`. On other ranks it
    passes the iterable through and does nothing else. `initial` is where a resumed run starts (its rate
    counts only the steps done since). `rank` defaults to this process's global rank.
    """
    active = (_rank() if rank is None else rank) == 0
    return RankProgress(iterable, total, desc, unit, active, initial)
