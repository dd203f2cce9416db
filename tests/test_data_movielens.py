"""The offline MovieLens builder, the time split and the MDS conversion (helpers/data/movielens.py,
movielens_format.py and mds.py).

All fast: small builds, no notebook, no training. Bad input must fail before any MDS file is written;
an MDS directory from an older run must be reused or replaced on purpose, never mixed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from helpers.data import movielens
from helpers.data.movielens import (
    GENRES,
    MovieLensFormatError,
    build_movielens,
    movielens_files,
    prepare_interactions,
    read_movielens,
    split_by_time,
    validate_ratings,
    write_mds,
)

SMALL = dict(num_users=60, num_movies=80, min_ratings=10, max_ratings=30)
COLUMNS = {"row": "int64", "user": "int32", "movie": "int32", "rating": "float32",
           "genres": "ndarray:float32:3"}


@pytest.fixture
def small(tmp_path):
    return build_movielens(tmp_path / "ml", seed=1, **SMALL)


def _samples(n: int = 50, offset: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(offset)
    return pd.DataFrame({"row": np.arange(n), "user": rng.integers(0, 9, n).astype(np.int32),
                         "movie": rng.integers(0, 9, n).astype(np.int32) + offset,
                         "rating": rng.random(n).astype(np.float32),
                         "genres": list(rng.random((n, 3)).astype(np.float32))})


def test_format_is_movielens(small):
    assert small.ratings_csv.read_text().splitlines()[0] == "userId,movieId,rating,timestamp"
    assert small.movies_csv.read_text().splitlines()[0] == "movieId,title,genres"
    ratings, movies = read_movielens(small.ratings_csv, small.movies_csv)
    assert ratings.userId.nunique() == SMALL["num_users"] and len(movies) == SMALL["num_movies"]
    assert ratings.groupby("userId").size().between(SMALL["min_ratings"], SMALL["max_ratings"]).all()
    assert ratings.movieId.isin(movies.movieId).all()
    assert (movies.movieId.diff().dropna() > 0).all()
    assert movies.movieId.max() > len(movies)  # gaps, as in real ids
    assert set(np.unique(ratings.rating * 2)) <= set(range(1, 11))  # half stars from 0.5 to 5
    assert {g for gs in movies.genres for g in gs.split("|")} <= set(GENRES)
    assert not ratings.duplicated(["userId", "movieId"]).any()
    assert ratings.timestamp.between(10**9, 2 * 10**9).all()


def test_deterministic_and_cached(tmp_path, small):
    again = build_movielens(tmp_path / "other", seed=1, **SMALL)
    assert again.built and again.ratings_csv.read_bytes() == small.ratings_csv.read_bytes()
    assert again.movies_csv.read_bytes() == small.movies_csv.read_bytes()
    assert not build_movielens(tmp_path / "ml", seed=1, **SMALL).built  # identical build: reused
    other = build_movielens(tmp_path / "seed2", seed=2, **SMALL)
    assert other.ratings_csv.read_bytes() != small.ratings_csv.read_bytes()


def test_split_by_time_has_no_leakage(small):
    ratings, _ = read_movielens(small.ratings_csv, small.movies_csv)
    train, test = split_by_time(ratings, holdout=3, min_train=5)
    assert len(train) + len(test) == len(ratings)
    assert test.groupby("userId").size().eq(3).all()
    last_train = train.groupby("userId").timestamp.max()
    assert (test.groupby("userId").timestamp.min() >= last_train.reindex(test.userId.unique())).all()
    assert train.merge(test, on=["userId", "movieId"]).empty  # no held-out pair appears in training
    both = pd.concat([train, test]).sort_values(["userId", "timestamp"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(both, ratings.sort_values(["userId", "timestamp"]).reset_index(drop=True))


def test_short_histories_stay_in_training():
    ratings = pd.DataFrame({"userId": [1] * 4 + [2] * 10, "movieId": range(14), "rating": 4.0,
                            "timestamp": range(14)})
    train, test = split_by_time(ratings, holdout=3, min_train=5)
    assert set(test.userId) == {2} and (train.userId == 1).sum() == 4
    assert list(test.movieId) == [11, 12, 13]  # the latest three


def test_prepare_interactions_indexes_and_builds_features_from_training_only(small):
    ratings, movies = read_movielens(small.ratings_csv, small.movies_csv)
    data = prepare_interactions(ratings, movies, holdout=3)
    assert len(data.train) + len(data.test) == len(ratings)
    assert (data.user_ids[data.train.user] == data.train.userId).all()         # indices map back to the ids
    assert (data.movie_ids[data.test.movie] == data.test.movieId).all()
    assert data.movie_genres.shape == (len(movies), len(data.genres))
    assert data.movie_genres.dtype == data.user_genres.dtype == np.float32
    assert set(data.movie_genres.ravel()) <= {0.0, 1.0}
    np.testing.assert_allclose(data.user_genres.sum(1), 1.0, rtol=1e-6)        # shares of the user's genres
    assert (data.item_counts == np.bincount(data.train.movie, minlength=len(movies))).all()
    # the profile counts training movies only: a user's held-out movies do not move it
    user = data.test.user.iloc[0]
    mine = data.train[data.train.user == user].movie.to_numpy()
    expected = data.movie_genres[mine].sum(0) / data.movie_genres[mine].sum()
    np.testing.assert_allclose(data.user_genres[user], expected, rtol=1e-6)
    samples = data.training_samples()
    assert list(samples.columns) == ["row", "user", "movie", "rating", "timestamp", "user_genres",
                                     "movie_genres"]
    assert (samples.row == np.arange(len(data.train))).all() and samples.user.dtype == np.int32
    np.testing.assert_array_equal(samples.movie_genres.iloc[5], data.movie_genres[data.train.movie.iloc[5]])


def test_prepare_interactions_refuses_a_leaky_split(small, monkeypatch):
    """A split that held out an earlier interaction (or repeated a training pair) is refused."""
    ratings, movies = read_movielens(small.ratings_csv, small.movies_csv)
    train, test = split_by_time(ratings, holdout=3)
    leaky = pd.concat([train, test.iloc[:1]], ignore_index=True)   # a held-out pair also in training
    monkeypatch.setattr(movielens, "split_by_time", lambda r, holdout: (leaky, test))
    with pytest.raises(AssertionError, match="also appears in training"):
        prepare_interactions(ratings, movies)
    early = test.assign(timestamp=test.timestamp - 10**9)            # held out before the user's training
    monkeypatch.setattr(movielens, "split_by_time", lambda r, holdout: (train, early))
    with pytest.raises(AssertionError, match="precedes its user's training"):
        prepare_interactions(ratings, movies)


def test_movielens_files_names_what_is_missing(tmp_path, small):
    assert movielens_files(small.ratings_csv.parent).movies_csv == small.movies_csv
    (tmp_path / "only-ratings").mkdir()
    (tmp_path / "only-ratings" / "ratings.csv").write_text(small.ratings_csv.read_text())
    with pytest.raises(FileNotFoundError, match="has no movies.csv: point it at an unzipped MovieLens"):
        movielens_files(tmp_path / "only-ratings")
    with pytest.raises(FileNotFoundError, match="has no ratings.csv or movies.csv"):
        movielens_files(tmp_path / "nowhere")


def test_missing_columns_fail_before_any_mds(tmp_path, small):
    bad = pd.read_csv(small.ratings_csv).drop(columns="timestamp").rename(columns={"userId": "user_id"})
    bad_csv = tmp_path / "ratings.csv"
    bad.to_csv(bad_csv, index=False)
    with pytest.raises(MovieLensFormatError, match=r"missing column\(s\) \['userId', 'timestamp'\].*rename"):
        read_movielens(bad_csv, small.movies_csv)
    out = tmp_path / "mds"
    with pytest.raises(MovieLensFormatError, match=r"lacks column\(s\) \['genres'\]"):
        write_mds(_samples().drop(columns="genres"), out, COLUMNS)
    assert not out.exists()


@pytest.mark.parametrize("bad_value", ["u17", 3.5])
def test_non_integer_ids_fail_clearly(tmp_path, small, bad_value):
    frame = pd.read_csv(small.ratings_csv)
    frame["userId"] = frame["userId"].astype(object)
    frame.loc[5, "userId"] = bad_value
    with pytest.raises(MovieLensFormatError, match=r"'userId' must hold integer ids.*e\.g\."):
        validate_ratings(frame, "ratings.csv")
    samples = _samples()
    samples["movie"] = samples["movie"].astype(float) + 0.5
    with pytest.raises(MovieLensFormatError, match="integer type"):
        write_mds(samples, tmp_path / "mds", COLUMNS)
    assert not (tmp_path / "mds").exists()


def test_integer_like_floats_are_accepted():
    frame = pd.DataFrame({"userId": [1.0, 2.0], "movieId": ["3", "4"], "rating": [4, 5], "timestamp": [1, 2]})
    out = validate_ratings(frame)
    assert out.userId.tolist() == [1, 2] and out.movieId.dtype == np.int64


def _shard_files(path):
    return sorted(p.name for p in path.iterdir() if p.name.startswith("shard."))


def test_mds_written_then_reused_or_replaced_never_mixed(tmp_path):
    out = tmp_path / "mds"
    first = write_mds(_samples(400), out, COLUMNS, size_limit=4096)
    assert not first.reused and not first.replaced and first.samples == 400 and len(first.shards) > 1
    index = json.loads((out / "index.json").read_text())
    assert index["shards"][0]["column_encodings"] == [COLUMNS[c] for c in sorted(COLUMNS)]
    assert index["shards"][0]["compression"] == "zstd" and index["shards"][0]["hashes"] == ["sha1", "xxh64"]
    assert _shard_files(out) == sorted(s["file"] for s in first.shards)
    stamp = (out / "index.json").stat().st_mtime_ns

    again = write_mds(_samples(400), out, COLUMNS, size_limit=4096)   # same data and settings: reused
    assert again.reused and (out / "index.json").stat().st_mtime_ns == stamp

    with pytest.raises(FileExistsError, match="existing='rebuild'"):
        write_mds(_samples(100, offset=7), out, COLUMNS, size_limit=4096, existing="error")
    assert _shard_files(out) == sorted(s["file"] for s in first.shards)  # untouched

    newer = write_mds(_samples(100, offset=7), out, COLUMNS, size_limit=4096)   # other data: replaced whole
    assert newer.replaced and newer.samples == 100
    assert _shard_files(out) == sorted(s["file"] for s in newer.shards)  # no shard of the old run left
    assert json.loads((out / "build.json").read_text())["samples"] == 100
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mds.")]  # no temporary folders left

    rebuilt = write_mds(_samples(100, offset=7), out, COLUMNS, size_limit=4096, existing="rebuild")
    assert rebuilt.replaced and not rebuilt.reused


def test_mds_info_counts_batches_and_shows_the_index(tmp_path):
    info = write_mds(_samples(50), tmp_path / "mds", COLUMNS, size_limit=1024)
    assert info.batches(8) == 7 and info.batches(50) == 1 and info.batches(49) == 2   # the last may be short
    index = json.loads(info.index_summary())
    assert index["version"] == 2
    assert index["shards[0]"]["column_encodings"][index["shards[0]"]["column_names"].index("genres")] == \
        "ndarray:float32:3"
    assert index["shards[0]"]["compression"] == "zstd"


def test_foreign_directory_is_never_deleted(tmp_path):
    out = tmp_path / "mds"
    out.mkdir()
    (out / "index.json").write_text("{}")  # e.g. shards written by another tool
    with pytest.raises(FileExistsError, match="not written by write_mds"):
        write_mds(_samples(), out, COLUMNS, existing="rebuild")
    assert (out / "index.json").read_text() == "{}"


def test_shards_read_back_with_streaming(tmp_path):
    """The shards round-trip through StreamingDataset (one process, in a child so its shared memory goes)."""
    frame = _samples(64)
    write_mds(frame, tmp_path / "mds", COLUMNS, size_limit=1024)
    code = textwrap.dedent(f"""
        import tempfile; tempfile.tempdir = {str(tmp_path)!r}
        from streaming import StreamingDataset
        ds = StreamingDataset(local={str(tmp_path / "mds")!r}, remote=None, shuffle=False, batch_size=8)
        rows = sorted((int(s["row"]), int(s["movie"]), float(s["genres"][1])) for s in ds)
        print(len(ds), rows[5])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "64"
    assert out.stdout.strip().endswith(f"(5, {frame.movie[5]}, {float(frame.genres[5][1])})")


def _kill_a_reader(tmp_path, folder: str) -> set[str]:
    """Run a StreamingDataset on `folder` and kill it hard, with its resource tracker (as when a job's process
    group is killed); returns the /dev/shm segments it left behind."""
    from helpers.integrations.streaming import streaming_segments

    write_mds(_samples(64), tmp_path / folder, COLUMNS, size_limit=1024)
    before = set(streaming_segments())
    code = textwrap.dedent(f"""
        import os, signal, tempfile; tempfile.tempdir = {str(tmp_path)!r}
        from streaming import StreamingDataset
        ds = StreamingDataset(local={str(tmp_path / folder)!r}, remote=None, shuffle=True, batch_size=8)
        next(iter(ds))
        from multiprocessing import resource_tracker
        os.kill(resource_tracker._resource_tracker._pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr
    leaked = set(streaming_segments()) - before
    assert leaked, "expected the killed reader to leave shared memory behind"
    return leaked


def test_crashed_reader_is_cleaned_by_clean_stale_shared_memory(tmp_path):
    """A hard-killed reader's /dev/shm segments would break the next run; Streaming's own cleanup removes them
    (and everyone else's: notebook 03 uses helpers.integrations.streaming, tested below)."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this system")
    leaked = _kill_a_reader(tmp_path, "mds")
    cleanup = "from streaming.base.util import clean_stale_shared_memory; clean_stale_shared_memory()"
    subprocess.run([sys.executable, "-c", cleanup], check=True, timeout=120)
    assert not leaked & set(os.listdir("/dev/shm"))


def test_leftovers_are_cleaned_and_a_live_run_keeps_its_segments(tmp_path):
    """Notebook 03's cleanup (helpers.integrations.streaming) removes what a killed reader left and leaves the
    segments of a reader still running alone: Streaming's clean_stale_shared_memory() unlinks those too."""
    if not os.path.isdir("/dev/shm") or not os.path.isdir("/proc"):
        pytest.skip("no /dev/shm or /proc on this system")
    from helpers.integrations.streaming import clean_streaming_leftovers, streaming_segments

    leaked = _kill_a_reader(tmp_path, "crashed")
    before = set(streaming_segments()) - leaked
    write_mds(_samples(64), tmp_path / "live", COLUMNS, size_limit=1024)
    live = textwrap.dedent(f"""
        import sys, tempfile; tempfile.tempdir = {str(tmp_path)!r}
        from streaming import StreamingDataset
        ds = StreamingDataset(local={str(tmp_path / "live")!r}, remote=None, shuffle=False, batch_size=8)
        print(sum(1 for _ in ds), flush=True)   # ready: its segments exist
        sys.stdin.readline()                    # ... and stay held while the cleanup runs
        print(sum(1 for _ in ds), flush=True)
    """)
    reader = subprocess.Popen([sys.executable, "-c", live], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "64", reader.stderr.read() if reader.poll() else ""
        held = set(streaming_segments()) - before - leaked
        assert held, "expected the running reader to hold shared memory"
        removed = set(clean_streaming_leftovers())
        assert leaked <= removed and not removed & held, (leaked, held, removed)
        assert held <= set(streaming_segments()) and not leaked & set(streaming_segments())
        out, err = reader.communicate("go\n", timeout=120)
        assert reader.returncode == 0 and out.strip() == "64", err   # the live run went on unharmed
    finally:
        if reader.poll() is None:
            reader.kill()
