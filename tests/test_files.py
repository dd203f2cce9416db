"""helpers.files: a reader never sees half a file, and a failed write leaves the old one and no litter."""

from __future__ import annotations

import json

import pytest

from helpers import files


def test_atomic_write_replaces_the_whole_file(tmp_path):
    target = tmp_path / "state.json"
    files.write_json(target, {"step": 1})
    files.write_json(target, {"step": 2}, indent=1)
    assert json.loads(target.read_text()) == {"step": 2}
    files.atomic_write(tmp_path / "raw.bin", b"\x00\x01")
    assert (tmp_path / "raw.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.bin", "state.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path):
    target = tmp_path / "state.json"
    files.write_json(target, {"step": 1})
    with pytest.raises(TypeError):
        files.write_json(target, {"step": object()})  # not JSON: fails before anything is written
    with pytest.raises(TypeError):
        files.atomic_write(target, 42)  # type: ignore[arg-type]
    assert json.loads(target.read_text()) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_temporary_names_differ_and_stay_out_of_globs(tmp_path):
    a, b = (files.temporary_sibling(tmp_path / "error-0.pkl") for _ in range(2))
    assert a != b and a.name.startswith(".") and a.suffix == ".tmp"
    a.write_text("x")
    assert list(tmp_path.glob("error-*.pkl")) == [] and list(tmp_path.glob("*.json")) == []
