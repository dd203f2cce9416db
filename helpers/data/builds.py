"""Reuse a cached build when its manifest matches, else rebuild it so that no half build is ever reused.

Every builder of helpers.data writes its files into a folder (the git-ignored cache by default) and
calls `reuse_or_build` with its arguments. The manifest is the mark of a complete build: it holds the
arguments (and whatever the builder adds), it is deleted before anything is rewritten, and it is written
last, atomically. A build interrupted half way therefore has no manifest and is rebuilt next time; a
manifest that cannot be read counts as none.

Two processes may want the same folder at once (two notebooks open in Jupyter that share a data set, or two
test workers): the check and the build happen under an exclusive lock on a file beside the manifest, so the
second waits for the first and then reuses its build instead of deleting the files it is writing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.files import write_json
from helpers.plain import plain

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Build:
    manifest: dict[str, Any]  # {"args": the build arguments, ...what the builder added}
    reused: bool  # True: an identical build was already there


def digest(args: Any, length: int = 64, algorithm: str = "sha256") -> str:
    """A short name for build arguments (JSON data), the same in every process: the hash of their JSON
    with sorted keys, as a cache folder's name."""
    return hashlib.new(algorithm, json.dumps(args, sort_keys=True).encode()).hexdigest()[:length]


def read_json(path: Path) -> Any:
    """The JSON at `path`, or None when it is missing or unreadable (half written by a build that died)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest at `path`, or None when it is missing, half written or not a manifest."""
    data = read_json(path)
    return data if isinstance(data, dict) and "args" in data else None


def reuse_or_build(folder: str | Path, args: dict[str, Any], outputs: Iterable[Path],
                   build: Callable[[], dict[str, Any] | None], *, manifest: str = MANIFEST) -> Build:
    """Reuse the build in `folder` if its manifest holds `args` and every output exists; else rebuild it.

    Rebuilding deletes the manifest, then the outputs (files or folders: a stale part never mixes with
    new ones; nothing else in `folder` is touched), calls `build()` to write them, and writes the
    manifest last with `args` and the dict `build()` returns. `args` must be JSON data.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{manifest}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when this process dies
        return _reuse_or_build(folder, args, list(outputs), build, folder / manifest)


def _reuse_or_build(folder: Path, args: dict[str, Any], outputs: list[Path],
                    build: Callable[[], dict[str, Any] | None], path: Path) -> Build:
    found = read_manifest(path)
    if found is not None and found["args"] == plain(args) and all(p.exists() for p in outputs):
        return Build(found, reused=True)
    path.unlink(missing_ok=True)
    for output in outputs:
        if output.is_dir():
            shutil.rmtree(output)
        else:
            output.unlink(missing_ok=True)
    record = {"args": args, **(build() or {})}
    write_json(path, record, indent=1, sort_keys=True)
    return Build(record, reused=False)
