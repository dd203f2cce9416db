"""How rank 0's bar states travel to the launching process: a JSON file per bar in the local launcher's
folder, or a Ray actor (`relay_ray_progress`) that works across machines."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from helpers.files import write_json
from helpers.progress import view as views
from helpers.progress.settings import MIN_INTERVAL, RELAY_NAME, progress_dir, switch
from helpers.progress.view import ProgressView, draw_while_running


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

    with draw_while_running(view, changed, interval, "helpers-progress"):
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
    view = views.progress_view(enabled)
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

        with draw_while_running(view, read, interval, "helpers-ray-progress"):
            yield view
    finally:
        with contextlib.suppress(Exception):
            ray.kill(relay)


# The rank's end of each transport.


class _FileSink:
    def __init__(self, folder: str, key: str):
        self._path = Path(folder) / f"{key.replace(':', '-')}.json"

    def __call__(self, state: dict[str, Any]) -> None:
        write_json(self._path, state)


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


def sink_for(key: str) -> Any | None:
    """Where rank 0 sends this bar: the launcher's folder, the Ray relay, or a view in this very process."""
    if switch() is False:
        return None
    folder = progress_dir()
    if folder:
        return _FileSink(folder, key)
    relay = _ray_relay()
    if relay is not None:
        return _RaySink(relay)
    view = views.progress_view()
    return view.show if view is not None else None
