"""helpers.shared_storage: the marks the notebook's process makes around a launch, and a rank's check."""

from __future__ import annotations

import os

import pytest

from helpers.shared_storage import MARKER_PREFIX, SharedStorageError, shared_paths


def test_folders_are_marked_for_the_launch_only_and_files_by_size(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    existing = tmp_path / "existing"
    existing.mkdir()
    out = tmp_path / "new" / "out"
    with shared_paths(data=data, output_dir=out, checkpoints=existing, skipped=None) as shared:
        assert (tmp_path / "new" / "out").is_dir(), "an output folder is created with its parents"
        assert [p.name for p in existing.iterdir()][0].startswith(MARKER_PREFIX)
        assert shared.check() == {"data": str(data), "output_dir": str(tmp_path / "new" / "out"),
                                  "checkpoints": str(existing)}
    assert list(existing.iterdir()) == [] and list((tmp_path / "new" / "out").iterdir()) == []


def test_a_missing_marker_or_another_file_fails_naming_shared_storage(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    with shared_paths(data=data, output_dir=tmp_path / "out") as shared:
        data.write_text("another machine's file of the same name\n")
        with pytest.raises(SharedStorageError, match=r"rank 0 on node .* cannot see the file data=.*\.jsonl"):
            shared.check()
        data.write_text("{}\n")
        os.remove(shared.paths[1].marker)
        with pytest.raises(SharedStorageError, match=r"output_dir=.*every node reaches.*cluster=None"):
            shared.check()


def test_a_path_that_is_neither_file_nor_folder_is_refused_and_leaves_no_marker(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="fifo: neither a file nor a folder"):
        with shared_paths(output_dir=tmp_path / "out", bad=tmp_path / "fifo"):
            pass
    assert list((tmp_path / "out").iterdir()) == []


def test_the_launch_option_marks_the_paths_and_every_rank_checks_them_first(tmp_path):
    from helpers import distributed
    from helpers.launch import LaunchError, SharedPathsChecked

    out = tmp_path / "out"

    @distributed(processes=2, device="cpu", shared={"output_dir": out, "unused": None})
    def markers():
        return sorted(p.name.startswith(MARKER_PREFIX) for p in out.iterdir())

    assert markers.distributed() == [[True], [True]]   # marked during the launch, seen by both ranks
    assert list(out.iterdir()) == []                    # and removed afterwards
    with pytest.raises(LaunchError, match="shared=.*pass a dict of name -> path"):
        markers.options(shared=[str(out)]).distributed()
    with shared_paths(output_dir=out) as marked:
        for p in out.iterdir():
            p.unlink()   # what a rank on another node sees: no marker
        ran = []
        with pytest.raises(SharedStorageError, match="cannot see the folder output_dir="):
            SharedPathsChecked(ran.append, marked)(1)
        assert ran == [], "the function must not run when the check fails"
