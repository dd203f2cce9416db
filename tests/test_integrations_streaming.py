"""MosaicML Streaming in the ranks (helpers/integrations/streaming.py): the run's lock folder, its leftovers
in /dev/shm, the threads an epoch cut short leaves running, and the proof that every rank read its own
samples.

The MDS round trips run in a child process, so that Streaming's shared memory goes with it; they are in the
`streaming` group of tests/plugins/xdist_scopes.py (see there why).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pandas as pd
import pytest

from helpers.data.movielens import write_mds
from helpers.integrations.streaming import (
    partition,
    stop_streaming_threads,
    streaming_leftovers,
    streaming_rank,
    streaming_run_folder,
)


def test_partition_of_disjoint_padded_ranks():
    split = partition([5, 5], [np.array([0, 2, 4, 6, 8]), np.array([1, 3, 5, 7, 1])], total=9)
    assert split.disjoint and split.covered and split.padding == 1
    assert split.table["distinct rows read"].tolist() == [5, 4]
    assert "the training set (9) + 1 repeated" in split.describe()


def test_partition_catches_overlap_and_gaps():
    overlap = partition([3, 3], [np.array([0, 1, 2]), np.array([2, 3, 4])], total=6)
    assert not overlap.disjoint and not overlap.covered            # row 2 twice, row 5 never
    gap = partition([2, 2], [np.array([0, 1]), np.array([2, 3])], total=5)
    assert gap.disjoint and not gap.covered and gap.padding == -1


def test_leftovers_are_the_segments_no_process_holds(tmp_path):
    (tmp_path / "000001_locals").write_bytes(b"x")
    (tmp_path / "not_streaming").write_bytes(b"x")
    assert streaming_leftovers(tmp_path) == ["000001_locals"]
    with open(tmp_path / "000002_barrier", "wb"):     # open in this process: in use
        assert streaming_leftovers(tmp_path) == ["000001_locals"]
    assert streaming_leftovers(tmp_path) == ["000001_locals", "000002_barrier"]


def test_the_run_folder_cleans_leftovers_first_and_goes_afterwards(tmp_path, capsys):
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "000007_locals").write_bytes(b"x")
    with streaming_run_folder(prefix="nb03-test-", root=shm) as folder:
        assert os.path.isdir(folder) and os.path.basename(folder).startswith("nb03-test-")
        assert not (shm / "000007_locals").exists()
    assert not os.path.exists(folder)
    assert "removed 1 Streaming segments" in capsys.readouterr().out
    with pytest.raises(RuntimeError), streaming_run_folder(root=shm) as folder:   # removed after a failure
        raise RuntimeError("a rank failed")
    assert not os.path.exists(folder) and capsys.readouterr().out == ""


@pytest.fixture
def tempdir():
    saved = tempfile.tempdir
    yield
    tempfile.tempdir = saved


def test_a_rank_puts_the_locks_in_the_run_folder(tmp_path, tempdir):
    with streaming_rank(str(tmp_path / "nb03-x")) as folder:
        assert folder == tmp_path / "nb03-x" and folder.is_dir()
        assert tempfile.gettempdir() == str(folder)
    assert folder.is_dir(), "on one machine the kernel removes the folder, after every rank is done"


def test_on_a_cluster_each_machine_has_its_own_folder_removed_at_the_end(tmp_path, tempdir, monkeypatch):
    tempfile.tempdir = str(tmp_path / "node-tmp")
    (tmp_path / "node-tmp").mkdir()
    monkeypatch.setenv("LOCAL_RANK", "0")
    with streaming_rank("/kernel/only/nb03-abc", on_cluster=True) as folder:
        assert folder == tmp_path / "node-tmp" / "nb03-abc" and folder.is_dir()
    assert not folder.exists(), "the first rank of the machine removes its folder"
    with pytest.raises(ValueError), streaming_rank("/kernel/only/nb03-def", on_cluster=True) as folder:
        raise ValueError("training failed")
    assert folder.exists(), "after an exception nothing waits at the barrier, nothing is removed"


def test_a_teardown_after_a_failed_setup_has_no_threads_to_stop():
    stop_streaming_threads(None)   # MDSRatings.teardown when its StreamingDataset was never made


def test_threads_of_an_epoch_cut_short_are_stopped_and_memory_released(tmp_path):
    """A StreamingDataset read for a few samples of an epoch: its threads still walk the epoch until
    `stop_streaming_threads`; `release_streaming_memory` then unlinks its segments (what Ray's workers
    need)."""
    frame = pd.DataFrame({"row": np.arange(400), "x": np.arange(400).astype(np.float32)})
    write_mds(frame, tmp_path / "mds", {"row": "int64", "x": "float32"}, size_limit=1024)
    code = textwrap.dedent(f"""
        import tempfile; tempfile.tempdir = {str(tmp_path)!r}
        from streaming import StreamingDataset
        from helpers.integrations.streaming import (release_streaming_memory, stop_streaming_threads,
                                                    streaming_segments)
        before = set(streaming_segments())
        dataset = StreamingDataset(local={str(tmp_path / "mds")!r}, remote=None, shuffle=True, batch_size=8)
        created = set(streaming_segments()) - before
        assert created, "expected the dataset to create shared memory"
        stop_streaming_threads(dataset)                   # never iterated: nothing to stop
        it = iter(dataset)
        [next(it) for _ in range(3)]                      # an epoch cut short: its threads walk on
        stop_streaming_threads(dataset)
        assert dataset._iterator._num_exited == 2, "the epoch's threads did not exit"
        assert dataset._executor._shutdown, "the thread pool was not shut down"
        assert release_streaming_memory() > 0
        assert not created & set(streaming_segments()), "the dataset's segments are still in /dev/shm"
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Invalid shard state" not in done.stderr
