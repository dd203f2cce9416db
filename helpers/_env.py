"""Temporary environment variables, restored exactly afterwards (set, changed or unset)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping


@contextlib.contextmanager
def temporary_environ(values: Mapping[str, str | None], keep_existing: Iterable[str] = ()) -> Iterator[None]:
    """Set the variables (None unsets one) for the duration of the block, then put back what was there.

    Names in `keep_existing` keep a value the user already set: those are defaults, not overrides.
    """
    keep = set(keep_existing)
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if k in keep and saved[k] is not None:
                continue
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
