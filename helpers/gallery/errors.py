"""The gallery commands' error, and the one place that turns it into an exit status.

Library functions (`runner.discover`, `runner.parse_overrides`, `compare.load_run`, ...) raise
`GalleryError` with a message that says what to change, so code that calls them (a test, a notebook,
another tool) can catch it. Only the command line (`python -m helpers.gallery`) prints it and exits, with
status 2, as argparse does for a bad command line.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

USAGE_ERROR = 2  # the exit status of a command line that was refused (1: notebooks failed or regressed)


class GalleryError(ValueError):
    """A gallery run, report or comparison that cannot go ahead as asked; the message names the fix."""


def exits_on_gallery_error(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a command's `main`: a GalleryError becomes its message on stderr and exit status 2."""

    @functools.wraps(main)
    def run(*args: object, **kwargs: object) -> int:
        try:
            return main(*args, **kwargs)
        except GalleryError as e:
            print(f"error: {e}", file=sys.stderr)
            return USAGE_ERROR

    return run
