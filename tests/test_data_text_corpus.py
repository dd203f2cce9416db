"""The offline text corpus: format, determinism, the split, reuse, a user's text, and bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.data.text_corpus import (
    MIN_BYTES,
    VOCAB_SIZE,
    build_text_corpus,
    stdlib_sources,
    unigram_bits_per_byte,
)


def test_stdlib_sources_exist_and_skip_tests():
    files = stdlib_sources()
    assert len(files) > 100
    assert all(f.suffix == ".py" for f in files)
    assert not any({"test", "tests", "site-packages", "encodings"} & set(f.parts) for f in files)


def test_format_split_and_determinism(tmp_path):
    a = build_text_corpus(seed=3, max_bytes=200_000, root=tmp_path / "a")
    b = build_text_corpus(seed=3, max_bytes=200_000, root=tmp_path / "b")
    c = build_text_corpus(seed=4, max_bytes=200_000, root=tmp_path / "c")
    train, val = a.load()
    assert train.dtype == np.uint8 and val.dtype == np.uint8
    assert len(train) + len(val) == 200_000
    assert len(val) == pytest.approx(20_000, abs=1)
    assert a.train_path.read_bytes() == b.train_path.read_bytes()       # same seed, same bytes
    assert a.val_path.read_bytes() == b.val_path.read_bytes()
    assert a.train_path.read_bytes() != c.train_path.read_bytes()       # another seed, other files
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["vocab_size"] == VOCAB_SIZE and manifest["files"] and manifest["args"]["seed"] == 3
    # The validation text is real text: mostly printable ASCII.
    assert np.mean((val >= 32) & (val < 127) | (val == 10)) > 0.9


def test_identical_build_is_reused(tmp_path):
    first = build_text_corpus(seed=0, max_bytes=50_000, root=tmp_path)
    stamp = first.train_path.stat().st_mtime_ns
    again = build_text_corpus(seed=0, max_bytes=50_000, root=tmp_path)
    assert again.train_path.stat().st_mtime_ns == stamp
    rebuilt = build_text_corpus(seed=0, max_bytes=60_000, root=tmp_path)   # other arguments: rebuilt
    assert len(rebuilt.load()[0]) + len(rebuilt.load()[1]) == 60_000


def test_user_text_file_and_folder(tmp_path):
    text = ("the quick brown fox jumps over the lazy dog\n" * 400).encode()
    one = tmp_path / "corpus.txt"
    one.write_bytes(text)
    built = build_text_corpus(one, root=tmp_path / "out1")
    train, val = built.load()
    assert bytes(train) + bytes(val) == text          # one file: its bytes, split at 90%
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(3):
        (folder / f"doc{i}.md").write_bytes(text[: 3000 + i])
    train, val = build_text_corpus(folder, root=tmp_path / "out2").load()
    assert len(train) + len(val) == 3 * 3000 + 3


def test_bad_input_says_what_to_change(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_path=.*does not exist"):
        build_text_corpus(tmp_path / "missing.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty folder"):
        build_text_corpus(tmp_path / "empty")
    small = tmp_path / "small.txt"
    small.write_text("hello")
    with pytest.raises(ValueError, match=f"at least {MIN_BYTES}"):
        build_text_corpus(small, root=tmp_path / "out")
    assert not (tmp_path / "out").exists()            # nothing written for a refused build
    with pytest.raises(ValueError, match="val_fraction"):
        build_text_corpus(val_fraction=0.9)


def test_unigram_baseline():
    rng = np.random.default_rng(0)
    uniform = rng.integers(0, 256, 200_000).astype(np.uint8)
    assert unigram_bits_per_byte(uniform, uniform[:10_000]) == pytest.approx(8.0, abs=0.01)
    two = np.array([65, 66] * 1000, dtype=np.uint8)
    assert unigram_bits_per_byte(two, two) == pytest.approx(1.0, abs=0.2)
