"""The drawing side: the bars rank 0 reports, drawn in the launching process (a Jupyter display updated in
place, or a tqdm bar on a terminal)."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from helpers.progress.settings import PROGRESS_METADATA_KEY, in_jupyter_kernel, switch


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
        metadata = {PROGRESS_METADATA_KEY: {"id": key, "n": state["n"], "total": state.get("total"),
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
    `GALLERY_PROGRESS=off` wins over everything; `on` draws on stderr even when it is not a terminal.
    """
    check_enabled(enabled)
    on = switch()
    if on is False or enabled is False:
        return None
    if in_jupyter_kernel():
        return ProgressView("display")
    if enabled or on or sys.stderr.isatty():
        return ProgressView("terminal")
    return None


@contextlib.contextmanager
def draw_while_running(view: ProgressView, read: Callable[[], Iterable[dict[str, Any]]], interval: float,
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
