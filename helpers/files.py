"""Writing files that other processes read while they are written: ranks, the launcher, builds and caches.

A reader sees either the old file or the whole new one, never a half-written one: the data goes to a temporary
file beside the target (unique per process and call, so two writers never share it) and `os.replace` swaps it
in, which is atomic on one filesystem. Plain standard library: the launcher's ranks import it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def temporary_sibling(path: str | Path) -> Path:
    """A name beside `path` that no other writer uses, hidden and ending in `.tmp`: globs for the real files
    skip it."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write `data` (bytes, or text as UTF-8) to `path` in one step; a failed write leaves nothing."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_json(path: str | Path, value: Any, **dumps: Any) -> Path:
    """`value` as JSON, written in one step (`dumps`: json.dumps's options, e.g. indent=1, sort_keys=True)."""
    return atomic_write(path, json.dumps(value, **dumps))
