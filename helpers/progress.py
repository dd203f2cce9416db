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

`HELPERS_PROGRESS=off` turns bars off everywhere; `HELPERS_PROGRESS=on` draws them in the launching process
even when stderr is not a terminal (a log file, a CI job). The launcher option `progress=False` turns them off
for one launch. A bar shows rates and times that change on every run, so the gallery tags each launching cell
`nbval-ignore-output` and nbval never compares it (tests/test_progress.py checks the tags).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

ENV_SWITCH = "HELPERS_PROGRESS"  # "off" / "on"; unset: draw in a Jupyter kernel or a terminal
ENV_DIR = "HELPERS_PROGRESS_DIR"  # set by the local launcher in each worker: where rank 0's bars go
RELAY_NAME = "helpers-progress"  # the Ray actor that carries bars from Ray workers to the driver
MIN_INTERVAL = 0.2  # seconds between two states sent for one bar (the first and the last always go)
METADATA_KEY = "helpers_progress"  # in the display's metadata, so tests can find bars in stored notebooks
_OFF = {"0", "off", "false", "no"}
_ON = {"1", "on", "true", "yes"}
_counter = 0
_counter_lock = threading.Lock()


def _switch() -> str | None:
    value = os.environ.get(ENV_SWITCH, "").strip().lower()
    if not value:
        return None
    if value in _OFF:
        return "off"
    if value in _ON:
        return "on"
    raise ValueError(
        f"{ENV_SWITCH}={os.environ[ENV_SWITCH]!r}: use 'on', 'off', or leave it unset (automatic).")


def _in_jupyter_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and getattr(shell, "kernel", None) is not None


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


# ----------------------------------------------------------------------------------- the drawing side


def format_bar(state: dict[str, Any], ncols: int | None = 100) -> str:
    """The bar as tqdm would print it (rate and ETA from the rank's own clock)."""
    from tqdm import tqdm

    total = state.get("total")
    return tqdm.format_meter(
        state["n"], total if total and math.isfinite(total) else None, state["elapsed"], ncols=ncols,
        prefix=state.get("desc") or "", unit=state.get("unit") or "it", postfix=state.get("postfix") or None,
        initial=state.get("initial") or 0,
    )


def _as_html(state: dict[str, Any], text: str) -> str:
    import html

    total = state.get("total")
    style = 'style="width:16em;vertical-align:middle"'
    value = f'value="{state["n"]}" max="{total}" ' if total and math.isfinite(total) else ""
    bar = f"<progress {value}{style}></progress>"
    return f'<div class="helpers-progress">{bar} <code>{html.escape(text)}</code></div>'


class ProgressView:
    """Draws the bars that rank 0 reports, keyed by bar id, in this (the launching) process."""

    def __init__(self, mode: str):
        if mode not in ("display", "terminal"):
            raise ValueError(f"mode={mode!r}: use 'display' (a Jupyter kernel) or 'terminal'")
        self.mode = mode
        self._bars: dict[str, Any] = {}  # id -> display handle or tqdm
        self._last: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def show(self, state: dict[str, Any]) -> None:
        """Draw or redraw one bar from its latest state; states of a bar already closed are ignored."""
        key = state["id"]
        with self._lock:
            last = self._last.get(key)
            if last is not None and (last.get("closed") or last == state):
                return
            self._last[key] = state
            if self.mode == "display":
                self._show_in_kernel(key, state)
            else:
                self._show_in_terminal(key, state)

    def _show_in_kernel(self, key: str, state: dict[str, Any]) -> None:
        from IPython.display import display

        text = format_bar(state)
        data = {"text/plain": text, "text/html": _as_html(state, text)}
        metadata = {METADATA_KEY: {"id": key, "n": state["n"], "total": state.get("total"),
                                   "closed": bool(state.get("closed"))}}
        handle = self._bars.get(key)
        if handle is None:
            self._bars[key] = display(data, raw=True, metadata=metadata, display_id=True)
        else:
            handle.update(data, raw=True, metadata=metadata)

    def _show_in_terminal(self, key: str, state: dict[str, Any]) -> None:
        from tqdm import tqdm

        bar = self._bars.get(key)
        total = state.get("total")
        if bar is None:
            bar = self._bars[key] = tqdm(total=total if total and math.isfinite(total) else None,
                                         desc=state.get("desc") or None, unit=state.get("unit") or "it",
                                         initial=state.get("initial") or 0, file=sys.stderr,
                                         dynamic_ncols=True, mininterval=0)
        bar.set_description_str(state.get("desc") or "", refresh=False)
        bar.set_postfix_str(state.get("postfix") or "", refresh=False)
        bar.n = state["n"]
        bar.refresh()
        if state.get("closed"):
            bar.close()

    def close(self) -> None:
        """The launch is over: a bar never closed (a crash, an interrupt) stays as it was last seen."""
        with self._lock:
            if self.mode == "terminal":
                for bar in self._bars.values():
                    bar.close()


def check_enabled(enabled: Any) -> None:
    """The one rule for the `progress` setting (the launchers' option, `progress_view`, the Ray relay)."""
    if enabled is not None and not isinstance(enabled, bool):
        raise ValueError(f"progress={enabled!r}: use True, False, or None (automatic).")


def progress_view(enabled: bool | None = None) -> ProgressView | None:
    """The view this process should draw bars in, or None where bars are off.

    `enabled=None` (automatic): in a Jupyter kernel, or in a terminal (stderr is a tty).
    `HELPERS_PROGRESS=off` wins over everything; `on` draws on stderr even when it is not a terminal.
    """
    check_enabled(enabled)
    switch = _switch()
    if switch == "off" or enabled is False:
        return None
    if _in_jupyter_kernel():
        return ProgressView("display")
    if enabled or switch == "on" or sys.stderr.isatty():
        return ProgressView("terminal")
    return None


@contextlib.contextmanager
def _draw_while_running(view: ProgressView, read: Callable[[], Iterable[dict[str, Any]]], interval: float,
                        name: str) -> Iterator[None]:
    """Draw what `read()` returns every `interval` seconds from a thread, once more at the end, then close."""
    stop = threading.Event()

    def draw() -> None:
        with contextlib.suppress(Exception):  # a relay hiccup must never fail the launch
            for state in read():
                view.show(state)

    def loop() -> None:
        while not stop.wait(interval):
            draw()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        draw()  # the last states, sent just before the ranks exited
        view.close()


@contextlib.contextmanager
def watch_progress_dir(folder: Path, view: ProgressView | None,
                       interval: float = MIN_INTERVAL) -> Iterator[None]:
    """While the block runs, draw every bar state that rank 0 writes into `folder` (the local launcher)."""
    if view is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    seen: dict[Path, int] = {}

    def changed() -> Iterator[dict[str, Any]]:
        for path in sorted(folder.glob("*.json")):
            try:
                stamp = path.stat().st_mtime_ns
                if seen.get(path) == stamp:
                    continue
                state = json.loads(path.read_text())
            except (OSError, ValueError):  # replaced while we looked: the next poll reads it
                continue
            seen[path] = stamp
            yield state

    with _draw_while_running(view, changed, interval, "helpers-progress"):
        yield


class _ProgressRelay:
    """A Ray actor holding the latest state of each bar until the driver takes it."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, Any]] = {}

    def put(self, state: dict[str, Any]) -> None:
        self._states[state["id"]] = state

    def take(self) -> list[dict[str, Any]]:
        states, self._states = self._states, {}
        return list(states.values())


@contextlib.contextmanager
def relay_ray_progress(enabled: bool | None = None,
                       interval: float = MIN_INTERVAL) -> Iterator[ProgressView | None]:
    """Draw the bars of Ray Train workers started inside this block (e.g. around `TorchTrainer.fit()`).

    Needs `ray.init()` first. Workers find the relay by name in the job's namespace, so nothing has to be
    passed to them: `progress_bar(...)` in the training loop is enough.
    """
    view = progress_view(enabled)
    if view is None:
        yield None
        return
    import ray

    if not ray.is_initialized():
        raise RuntimeError("relay_ray_progress() needs a Ray connection: call ray.init() "
                           "(or ray.init(address=...)) first.")
    try:
        ray.get_actor(RELAY_NAME)
    except ValueError:
        pass
    else:
        raise RuntimeError(f"another relay_ray_progress() (actor {RELAY_NAME!r}) is active in this Ray job; "
                           "nest launches outside it, or pass enabled=False to one of them.")
    relay = ray.remote(num_cpus=0)(_ProgressRelay).options(name=RELAY_NAME).remote()
    ray.get(relay.take.remote())  # the actor is up before any worker looks for it
    try:
        def read() -> list[dict[str, Any]]:
            return ray.get(relay.take.remote())

        with _draw_while_running(view, read, interval, "helpers-ray-progress"):
            yield view
    finally:
        with contextlib.suppress(Exception):
            ray.kill(relay)


# ------------------------------------------------------------------------------------ the rank side


class _FileSink:
    def __init__(self, folder: str, key: str):
        self._path = Path(folder) / f"{key.replace(':', '-')}.json"

    def __call__(self, state: dict[str, Any]) -> None:
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self._path)


class _RaySink:
    def __init__(self, relay: Any):
        self._relay = relay

    def __call__(self, state: dict[str, Any]) -> None:
        self._relay.put.remote(state)  # fire and forget: never wait on the driver inside a training step


def _ray_relay() -> Any | None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        return ray.get_actor(RELAY_NAME)
    except Exception:
        return None


def _sink_for(key: str) -> Any | None:
    """Where rank 0 sends this bar: the launcher's folder, the Ray relay, or a view in this very process."""
    switch = _switch()
    if switch == "off":
        return None
    folder = os.environ.get(ENV_DIR)
    if folder:
        return _FileSink(folder, key)
    relay = _ray_relay()
    if relay is not None:
        return _RaySink(relay)
    view = progress_view()
    return view.show if view is not None else None


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
            self._sink = _sink_for(self.id)
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


# ---------------------------------------------------------------------------------- framework adapters


def lightning_progress_bar() -> Any:
    """A Lightning `ProgressBar` callback that draws through `progress_bar` (Lightning's TQDM bar
    cannot be shown live through a worker's log). Pass it in `Trainer(callbacks=[...])`."""
    from lightning.pytorch.callbacks import ProgressBar

    class HelpersProgressBar(ProgressBar):
        def __init__(self) -> None:
            super().__init__()
            self._enabled = True
            self._bar: RankProgress[Any] | None = None

        def disable(self) -> None:
            self._enabled = False

        def enable(self) -> None:
            self._enabled = True

        @property
        def is_enabled(self) -> bool:
            return self._enabled

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if self._enabled:
                epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
                self._bar = progress_bar(total=self.total_train_batches,
                                         desc=f"epoch {trainer.current_epoch + 1}{epochs}", unit="batch",
                                         rank=trainer.global_rank)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            if self._bar is not None:
                self._bar.set_postfix(refresh=False, **self._metrics(trainer, pl_module))
                self._bar.update(batch_idx + 1 - self._bar.n)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if self._bar is not None:  # validation has run by now: its metrics go on the closed bar
                self._bar.set_postfix(refresh=False, **self._metrics(trainer, pl_module))
                self._bar.close()
                self._bar = None

        def _metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
            return {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k != "v_num"}

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    return HelpersProgressBar()


def transformers_progress_callback(desc: str = "training") -> Any:
    """A `transformers.TrainerCallback` (Trainer, TRL's SFTTrainer) that draws the optimiser steps through
    `progress_bar`, with the last logged loss. Use it with `disable_tqdm=True`."""
    from transformers import TrainerCallback

    class HelpersProgressCallback(TrainerCallback):
        def __init__(self) -> None:
            self._bar: RankProgress[Any] | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._bar = progress_bar(total=state.max_steps, desc=desc, unit="step",
                                     rank=0 if state.is_world_process_zero else 1)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._bar is not None:
                self._bar.update(state.global_step - self._bar.n)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
                   **kwargs: Any) -> None:
            if self._bar is not None and logs and "loss" in logs:
                self._bar.set_postfix(loss=float(logs["loss"]))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    return HelpersProgressCallback()
