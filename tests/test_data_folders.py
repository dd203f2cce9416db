"""helpers.data.folders: a folder replaced whole, or not at all."""

from __future__ import annotations

import pytest

from helpers.data.folders import replaced_folder


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def test_a_new_folder_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "shards"
    target.mkdir()
    (target / "old.bin").write_text("old")
    with replaced_folder(target) as new:
        assert not new.exists() and new.parent == tmp_path
        new.mkdir()
        (new / "new.bin").write_text("new")
        assert _files(target) == ["old.bin"], "the old folder stays whole until the block ends"
    assert _files(target) == ["new.bin"]
    assert _files(tmp_path) == ["shards"], "no temporary or old folder is left beside it"


def test_an_error_leaves_the_old_folder_as_it_was(tmp_path):
    target = tmp_path / "shards"
    target.mkdir()
    (target / "old.bin").write_text("old")
    with pytest.raises(RuntimeError, match="half way"), replaced_folder(target) as new:
        new.mkdir()
        (new / "part.bin").write_text("part")
        raise RuntimeError("the writer died half way")
    assert _files(target) == ["old.bin"] and _files(tmp_path) == ["shards"]


def test_a_missing_or_empty_target_gets_the_new_folder(tmp_path):
    for target in (tmp_path / "missing", tmp_path / "empty"):
        if target.name == "empty":
            target.mkdir()
        with replaced_folder(target) as new:
            new.mkdir()
            (new / "a").write_text("a")
        assert _files(target) == ["a"]
