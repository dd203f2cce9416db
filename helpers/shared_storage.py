"""Paths the ranks read or write, checked in every rank before training: on a cluster, shared storage.

On one machine every rank sees the notebook's files. On a Ray cluster a rank runs on whichever node Ray
places it, and a folder that exists only on the notebook's machine is either missing there or, worse, a
different folder of the same name (a rank writes its checkpoints where nobody reads them). So the notebook's
process marks each path around the launch, and each rank checks the mark before any training:

    with shared_paths(data=corpus_dir, output_dir=out) as shared:
        results = train.distributed(cfg, shared)

    def train(cfg, shared):               # in every rank, first thing
        shared.check()                    # SharedStorageError naming the path, the rank and its node

A folder gets a marker file with a fresh name (created with its parents when it is an output that does not
exist yet), removed again when the launch returns; a file is recognised by its size. The check is the same
on one machine, where it always passes.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MARKER_PREFIX = ".gallery-shared-"


class SharedStorageError(FileNotFoundError):
    """A rank cannot see a path the notebook's process marked: it is not on storage every node reaches."""


@dataclass(frozen=True)
class SharedPath:
    name: str                 # the notebook's parameter name, e.g. "output_dir"
    path: str                 # absolute
    marker: str | None        # a folder: the marker file written into it
    size: int | None          # a file: its size in bytes


@dataclass(frozen=True)
class SharedPaths:
    """What the notebook's process marked; picklable, so it travels to the ranks with the call."""

    paths: tuple[SharedPath, ...]

    def check(self) -> dict[str, str]:
        """In a rank: raise `SharedStorageError` unless every marked path is here; return name -> path."""
        from helpers.context import worker_context

        for item in self.paths:
            if item.marker is not None:
                seen = os.path.isfile(item.marker)
            else:
                seen = os.path.isfile(item.path) and os.path.getsize(item.path) == item.size
            if not seen:
                ctx = worker_context()
                what, how = ("folder", "marked") if item.marker is not None else ("file", "reads")
                raise SharedStorageError(
                    f"rank {ctx.rank} on node {ctx.node} cannot see the {what} {item.name}={item.path} that "
                    f"the notebook's process {how}: paths the ranks read or write must be on storage every "
                    "node reaches (NFS, a mounted bucket). Put it on shared storage and pass that path, or "
                    "run on one machine (cluster=None).")
        return {item.name: item.path for item in self.paths}


@contextlib.contextmanager
def shared_paths(**paths: str | os.PathLike | None) -> Iterator[SharedPaths]:
    """Around a launch, in the notebook's process: mark each path (None is skipped) for the ranks' check.

    An existing file is an input (its size is what a rank compares); anything else is a folder, created
    when missing, into which a marker file is written and, at the end, removed.
    """
    token = uuid.uuid4().hex
    marked: list[SharedPath] = []
    try:
        for name, value in paths.items():
            if value is None:
                continue
            path = Path(value).expanduser().resolve()
            if path.is_file():
                marked.append(SharedPath(name, str(path), None, path.stat().st_size))
                continue
            if path.exists() and not path.is_dir():
                raise ValueError(f"{name}={value}: neither a file nor a folder; pass a folder or a file")
            path.mkdir(parents=True, exist_ok=True)
            marker = path / f"{MARKER_PREFIX}{token}"
            marker.write_text("written by the notebook's process; each rank checks that it sees this file\n")
            marked.append(SharedPath(name, str(path), str(marker), None))
        yield SharedPaths(tuple(marked))
    finally:
        for item in marked:
            if item.marker is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(item.marker)
