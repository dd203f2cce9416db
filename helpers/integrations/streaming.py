"""MosaicML Streaming in the gallery's ranks: where its file locks go, the shared memory it leaves behind, the
threads a short epoch leaves running, and the proof that every rank read its own samples.

Streaming's ranks coordinate through shared-memory segments in /dev/shm named `000000_locals`,
`000000_barrier`, ... and file locks in the temporary folder. Four things need care around it in a notebook:

* a run killed hard (its resource tracker with it) leaves its segments in /dev/shm, and the next
  `StreamingDataset` on the same local folder then fails. Streaming's own `clean_stale_shared_memory()`
  unlinks *every* such segment on the machine, those of a run in progress too, which breaks that run (two
  notebooks 03 at once, two users' jobs, two test workers). A segment a live process uses is mapped into that
  process or open in it, which `/proc/<pid>/maps` and `/proc/<pid>/fd` show: `clean_streaming_leftovers`
  removes only the segments no process holds;
* the file locks go to the temporary folder: `streaming_rank` points them at a folder of this run, removed
  afterwards, instead of /tmp;
* Streaming releases its shared memory at exit, in handlers that a Ray worker never runs (Ray ends its
  workers with a signal): on a cluster `streaming_rank` releases it when the rank is done;
* an epoch cut short (a step cap) leaves Streaming's download threads walking the rest of the epoch's sample
  ids, and after the last epoch nothing stops them: `stop_streaming_threads`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


def streaming_leftovers(root: Path = SHM) -> list[str]:
    """The Streaming segments in `root` that no process holds: what a run left behind (another Streaming job's
    live segments are not counted)."""
    return sorted(set(streaming_segments(root)) - segments_in_use(root))


@contextlib.contextmanager
def streaming_run_folder(prefix: str = "streaming-", root: Path = SHM) -> Iterator[str]:
    """In the kernel, around a launch of ranks that use Streaming: first remove the segments that crashed
    Streaming runs left in /dev/shm (`clean_streaming_leftovers`: never a live run's; they would make the
    next `StreamingDataset` fail), saying how many when there were some; then yield a fresh folder for the
    run's file locks (pass it to `streaming_rank` in the ranks), removed afterwards."""
    removed = clean_streaming_leftovers(root)
    if removed:
        print(f"removed {len(removed)} Streaming segments that crashed runs left in {root}")
    folder = tempfile.mkdtemp(prefix=prefix)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def streaming_rank(lock_folder: str, *, on_cluster: bool = False) -> Iterator[Path]:
    """In a rank, around everything that uses Streaming: its file locks go to `lock_folder`, which the ranks
    of one machine share (`tempfile.tempdir`, where Streaming puts them).

    On a cluster (`on_cluster`), the kernel's folder exists on its own machine only: each machine's ranks use
    a folder of the same name in their temporary folder, and at the end, once every rank is done with
    Streaming (a barrier), each rank releases its shared memory (`release_streaming_memory`) and the first
    rank of each machine removes the machine's folder. After an exception nothing waits at the barrier.
    """
    before = tempfile.tempdir
    folder = Path(tempfile.gettempdir()) / Path(lock_folder).name if on_cluster else Path(lock_folder)
    folder.mkdir(exist_ok=True)
    tempfile.tempdir = str(folder)
    # Streaming hands out samples as read-only views of a shard's bytes, and torch warns when it wraps them
    # in tensors: the batches are never written to.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    yield folder
    if on_cluster:
        _barrier()
        release_streaming_memory()
        if os.environ.get("LOCAL_RANK", "0") == "0":
            shutil.rmtree(folder, ignore_errors=True)
        tempfile.tempdir = before   # the folder is gone (a Ray worker may run another task)


def _barrier() -> None:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def release_streaming_memory() -> int:
    """Unlink the shared memory of this process's Streaming datasets; returns how many segments.

    Streaming does it at exit, in handlers that a Ray worker never runs (Ray ends its workers with a signal):
    on a cluster, each rank calls it when done (`streaming_rank` does).
    """
    import gc

    from streaming.base.shared.memory import SharedMemory

    with warnings.catch_warnings():   # isinstance reads __class__: deprecated torch aliases warn when asked
        warnings.simplefilter("ignore")
        segments = [o for o in gc.get_objects() if isinstance(o, SharedMemory)]
    for shm in segments:
        shm.cleanup()
    return len(segments)


def stop_streaming_threads(dataset: Any) -> None:
    """Stop the threads a `StreamingDataset` runs for its current epoch (call it in a DataModule's teardown).

    An epoch cut short (a step cap: `limit_train_batches`) leaves Streaming's download threads walking the
    rest of its sample ids. The next epoch's `iter()` stops them; after the last epoch nothing does, and they
    outlive the dataset's shared memory ("Invalid shard state: 0" once the rank exits). Streaming 0.13 has
    no public call for this: this stops them as its own `__iter__` does. Safe on a dataset never iterated, and
    on None (a teardown after a setup that failed).
    """
    iterator = getattr(dataset, "_iterator", None)
    if iterator is not None:
        iterator.exit()
        dataset._executor.shutdown(wait=True)


@dataclass(frozen=True)
class Partition:
    """How an epoch's samples were spread over the ranks (see `partition`)."""

    table: Any          # a pandas DataFrame: per rank, samples per epoch and distinct sample ids read
    total: int          # the samples of the data set
    padding: int        # samples read twice so that every rank reads as many
    disjoint: bool      # no sample id was read by two ranks (repeats within a rank aside)
    covered: bool       # together, the ranks read every sample id in range(total)

    def describe(self) -> str:
        per_epoch, distinct = self.table["samples per epoch"].sum(), self.table["distinct rows read"].sum()
        return (f"samples per epoch over all ranks: {per_epoch:,} = the training set ({self.total:,}) + "
                f"{self.padding} repeated to pad the ranks\n"
                f"distinct rows over all ranks: {distinct:,}; disjoint: {self.disjoint}; they cover the "
                f"training set: {self.covered}")


def partition(epoch_sizes: Sequence[int], rows_read: Sequence[np.ndarray], total: int) -> Partition:
    """What each rank read of an epoch whose sample ids are `range(total)`: `epoch_sizes[r]` is the length of
    rank r's `StreamingDataset` (its share of an epoch), `rows_read[r]` the sample ids it trained on."""
    import pandas as pd

    distinct = [np.unique(rows) for rows in rows_read]
    table = pd.DataFrame({"samples per epoch": list(epoch_sizes),
                          "distinct rows read": [len(d) for d in distinct]},
                         index=pd.RangeIndex(len(distinct), name="rank"))
    every = np.concatenate(distinct) if distinct else np.array([], dtype=np.int64)
    unique = np.unique(every)
    return Partition(table, total, int(sum(epoch_sizes)) - total, len(unique) == len(every),
                     len(unique) == total and bool((unique == np.arange(total)).all()))
