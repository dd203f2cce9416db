"""The one reuse-or-rebuild rule every data builder uses (helpers.data.builds)."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from helpers.data.builds import read_manifest, reuse_or_build


class Writer:
    """A builder that writes `out.txt` (and counts its builds), or fails half way when told to."""

    def __init__(self, folder):
        self.out = folder / "out.txt"
        self.calls = 0

    def build(self, text: str, fail: bool = False):
        def write():
            self.calls += 1
            self.out.write_text(text[: len(text) // 2])
            if fail:
                raise KeyboardInterrupt("interrupted half way")
            self.out.write_text(text)
            return {"chars": len(text)}

        return write


def test_identical_build_is_reused_and_other_arguments_rebuild(tmp_path):
    w = Writer(tmp_path)
    first = reuse_or_build(tmp_path, {"n": 1, "shape": (2, 3)}, [w.out], w.build("one"))
    again = reuse_or_build(tmp_path, {"n": 1, "shape": (2, 3)}, [w.out], w.build("one"))
    assert not first.reused and again.reused and w.calls == 1
    assert again.manifest == {"args": {"n": 1, "shape": [2, 3]}, "chars": 3}
    other = reuse_or_build(tmp_path, {"n": 2, "shape": (2, 3)}, [w.out], w.build("two!"))
    assert not other.reused and w.out.read_text() == "two!" and w.calls == 2


def test_an_interrupted_rebuild_is_never_reused(tmp_path):
    w = Writer(tmp_path)
    reuse_or_build(tmp_path, {"n": 1}, [w.out], w.build("first build"))
    with pytest.raises(KeyboardInterrupt):
        reuse_or_build(tmp_path, {"n": 2}, [w.out], w.build("second build", fail=True))
    assert read_manifest(tmp_path / "manifest.json") is None, "the old manifest must go before the rewrite"
    again = reuse_or_build(tmp_path, {"n": 1}, [w.out], w.build("first build"))
    assert not again.reused and w.out.read_text() == "first build"


def test_a_damaged_manifest_or_a_missing_output_rebuilds(tmp_path):
    w = Writer(tmp_path)
    reuse_or_build(tmp_path, {"n": 1}, [w.out], w.build("x"))
    (tmp_path / "manifest.json").write_text('{"args": {"n": 1}')  # cut short
    assert not reuse_or_build(tmp_path, {"n": 1}, [w.out], w.build("x")).reused
    w.out.unlink()
    assert not reuse_or_build(tmp_path, {"n": 1}, [w.out], w.build("x")).reused
    assert w.calls == 3


def test_only_the_builders_outputs_are_replaced(tmp_path):
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / "stale.png").write_text("old")
    (tmp_path / "users_notes.txt").write_text("keep me")

    def write():
        (tmp_path / "part").mkdir()
        (tmp_path / "part" / "new.png").write_text("new")

    reuse_or_build(tmp_path, {"n": 1}, [tmp_path / "part"], write)
    assert [p.name for p in (tmp_path / "part").iterdir()] == ["new.png"]
    assert (tmp_path / "users_notes.txt").read_text() == "keep me"


def _build_slowly(folder: str, started, results) -> None:
    """One process's build of `folder`: it writes its file in two halves, a second apart."""
    import time
    from pathlib import Path

    out = Path(folder) / "out.txt"

    def write():
        started.set()
        out.write_text("half")
        time.sleep(1.0)
        out.write_text("whole build")
        return {"pid": os.getpid()}

    build = reuse_or_build(folder, {"n": 1}, [out], write)
    results.put((build.reused, build.manifest["pid"], out.read_text()))


def test_two_processes_building_one_folder_at_once_build_it_once(tmp_path):
    """The second waits for the lock, then reuses the first's build instead of deleting files mid-write."""
    ctx = multiprocessing.get_context("fork")
    started, results = ctx.Event(), ctx.Queue()
    first = ctx.Process(target=_build_slowly, args=(str(tmp_path), started, results))
    first.start()
    assert started.wait(60), "the first build never started"
    second = ctx.Process(target=_build_slowly, args=(str(tmp_path), ctx.Event(), results))
    second.start()
    outcomes = sorted(results.get(timeout=60) for _ in range(2))
    first.join(10), second.join(10)
    assert [reused for reused, _, _ in outcomes] == [False, True], outcomes
    assert {pid for _, pid, _ in outcomes} == {first.pid}, "both must report the first process's build"
    assert {text for _, _, text in outcomes} == {"whole build"}, "a reader saw a half-written build"


def test_digest_is_the_hash_of_the_sorted_json_of_the_arguments():
    import hashlib

    from helpers.data.builds import digest

    args = {"b": 1, "a": (2, 3)}
    assert digest(args) == hashlib.sha256(b'{"a": [2, 3], "b": 1}').hexdigest()
    assert digest(args, 10, "sha1") == hashlib.sha1(b'{"a": [2, 3], "b": 1}').hexdigest()[:10]
    assert digest({"a": [2, 3], "b": 1}, 12) == digest(args, 12)
