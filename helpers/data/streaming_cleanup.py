"""Remove the shared memory that crashed MosaicML Streaming runs left behind, and nothing a live run uses.

Streaming's ranks coordinate through segments in /dev/shm named `000000_locals`, `000000_barrier`, ...
A run killed hard (its resource tracker with it) leaves them there, and the next `StreamingDataset` on the
same local folder then fails. Streaming's own `clean_stale_shared_memory()` unlinks *every* such segment
on the machine, those of a run in progress too, which breaks that run (two notebooks 03 at once, two
users' jobs, two test workers). A segment a live process uses is mapped into that process or open in it,
which `/proc/<pid>/maps` and `/proc/<pid>/fd` show, so this removes only the segments no process holds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SHM = Path("/dev/shm")
SEGMENT = re.compile(r"^\d{6}_")   # Streaming's names: a six-digit prefix, then the segment's role


def streaming_segments(root: Path = SHM) -> list[str]:
    """Names of Streaming's segments in `root`."""
    if not root.is_dir():
        return []
    return sorted(p for p in os.listdir(root) if SEGMENT.match(p))


def segments_in_use(root: Path = SHM, proc: Path = Path("/proc")) -> set[str]:
    """Streaming segments that some process this user can inspect has mapped or open."""
    prefix = f"{root}/"
    used: set[str] = set()
    for pid in (p for p in os.listdir(proc) if p.isdigit()):
        try:
            with open(proc / pid / "maps") as maps:
                for line in maps:
                    at = line.find(prefix)
                    if at >= 0:
                        used.add(line[at + len(prefix):].split()[0])
            for fd in os.listdir(proc / pid / "fd"):
                target = os.readlink(proc / pid / "fd" / fd)
                if target.startswith(prefix):
                    used.add(target[len(prefix):].split()[0])
        except OSError:   # the process ended, or belongs to someone else (whose segments we cannot unlink)
            continue
    return {name for name in used if SEGMENT.match(name)}


def clean_streaming_leftovers(root: Path = SHM) -> list[str]:
    """Unlink the Streaming segments no live process holds; returns their names.

    Call it before starting Streaming, instead of `clean_stale_shared_memory()`, when other Streaming jobs may
    be running on the machine. Segments of another user's processes cannot be inspected here, and cannot be
    unlinked either (/dev/shm is sticky): they are left alone.
    """
    if not root.is_dir() or not Path("/proc").is_dir():
        return []
    candidates = streaming_segments(root)
    if not candidates:
        return []
    in_use = segments_in_use(root)
    removed = []
    for name in candidates:
        if name in in_use:
            continue
        try:
            (root / name).unlink()
            removed.append(name)
        except (FileNotFoundError, PermissionError):   # gone meanwhile, or someone else's
            continue
    return removed
