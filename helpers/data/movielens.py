"""Ratings in MovieLens format, built offline, and their conversion to MosaicML Streaming (MDS) shards.

Notebook 03 trains a two-tower recommender on MovieLens (`ratings.csv`: userId,movieId,rating,timestamp;
`movies.csv`: movieId,title,genres). Nothing can be downloaded at run time, so `build_movielens` writes
a small data set in exactly that format, with structure a model can learn and a baseline cannot fully
exploit: every user and movie has hidden taste factors, genres follow those factors, a popularity skew
makes "most popular" a fair baseline, and timestamps are independent of taste so that holding out each
user's latest interactions tests generalisation to the future, not to a different distribution.

The same module reads a real MovieLens download (`read_movielens`), checks it before anything is
written (`validate_ratings`), splits it by time per user (`split_by_time`), and writes MDS shards
(`write_mds`) so that a directory left by an older run is either reused (identical input and settings)
or replaced as a whole, never mixed with new shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from helpers.data.builds import reuse_or_build
from helpers.paths import cache_dir

# The 18 genres of MovieLens (plus "(no genres listed)", which real files also use).
GENRES = ("Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War",
          "Western")
RATINGS_COLUMNS = ("userId", "movieId", "rating", "timestamp")
MOVIES_COLUMNS = ("movieId", "title", "genres")
BUILD_VERSION = 1  # bump when the generator changes, so cached builds are not reused
MANIFEST = "build.json"

_ADJECTIVES = ("Silent", "Broken", "Golden", "Last", "Hidden", "Crimson", "Endless", "Wild", "Lost", "Iron",
               "Midnight", "Frozen", "Burning", "Secret", "Distant", "Electric", "Hollow", "Savage")
_NOUNS = ("River", "Empire", "Garden", "Signal", "Harbor", "Machine", "Kingdom", "Shadow", "Island",
          "Letter", "Storm", "Station", "Mirror", "Frontier", "Orchard", "Circus", "Voyage", "Witness")


class MovieLensFormatError(ValueError):
    """A ratings or movies table that is not in MovieLens format (raised before anything is written)."""


@dataclass(frozen=True)
class MovieLensFiles:
    ratings_csv: Path
    movies_csv: Path
    built: bool  # False: an identical earlier build was reused

    def mds_cache(self, holdout: int) -> str:
        """Where the MDS shards of this data's training split go by default: the cache, by folder name."""
        return str(cache_dir("movielens-mds") / f"train-{self.ratings_csv.parent.name}-h{holdout}")


def build_movielens(out_dir: str | Path | None = None, *, num_users: int = 1000, num_movies: int = 500,
                    min_ratings: int = 20, max_ratings: int = 80, factors: int = 8, taste: float = 2.5,
                    popularity: float = 0.8, seed: int = 0) -> MovieLensFiles:
    """Write `ratings.csv` and `movies.csv` in MovieLens format; skip the work if an identical build exists.

    How the data is made (so that learning is measurable):
    * users and movies get hidden factor vectors; a user picks movies with probability proportional to
      exp(taste * <user, movie> / sqrt(factors) + popularity * movie bias) (without replacement), so
      a model that learns the factors beats the popularity ranking by a margin;
    * each movie's 1-3 genres are the genres whose directions its factors point to most (plus noise), so
      genre features carry part of the taste signal (what helps cold or rare movies);
    * the movie bias is a Zipf-like skew: a few movies are watched by many users;
    * each user's interactions are put in random order in time, so the latest ones (held out) come from
      the same tastes as the earlier ones; ratings follow affinity, on MovieLens's 0.5-5 half-star scale;
    * movie ids are not contiguous (as in MovieLens), so the notebook's re-indexing is exercised.
    """
    args = dict(num_users=num_users, num_movies=num_movies, min_ratings=min_ratings, max_ratings=max_ratings,
                factors=factors, taste=taste, popularity=popularity, seed=seed, version=BUILD_VERSION)
    if not (0 < min_ratings <= max_ratings <= num_movies):
        raise ValueError(f"need 0 < min_ratings ({min_ratings}) <= max_ratings ({max_ratings}) "
                         f"<= num_movies ({num_movies}).")
    out = Path(out_dir) if out_dir is not None else cache_dir("movielens", _digest(args)[:12])
    ratings_csv, movies_csv = out / "ratings.csv", out / "movies.csv"

    def write() -> None:
        ratings, movies = _make_tables(num_users=num_users, num_movies=num_movies, min_ratings=min_ratings,
                                       max_ratings=max_ratings, factors=factors, taste=taste,
                                       popularity=popularity, seed=seed)
        ratings.to_csv(ratings_csv, index=False)
        movies.to_csv(movies_csv, index=False)

    build = reuse_or_build(out, args, [ratings_csv, movies_csv], write, manifest=MANIFEST)
    return MovieLensFiles(ratings_csv, movies_csv, built=not build.reused)


# The shape of MovieLens 25M: users and movies (its 25,000,095 ratings are about 155 per user).
ML25M_USERS, ML25M_MOVIES = 162_541, 59_047


def build_movielens_shaped(out_dir: str | Path | None = None, *, num_users: int = ML25M_USERS,
                           num_movies: int = ML25M_MOVIES, ratings_per_user: int = 8,
                           active_share: float = 0.3, seed: int = 0) -> MovieLensFiles:
    """A stand-in with the *shape* of a real MovieLens download, for what grows with users and movies.

    `build_movielens` draws every user's movies from a users x movies affinity matrix so that there is taste
    to learn; at the ml-25m shape that matrix alone is 77 GB. This builder draws from popularity only, in
    vectorised form (seconds for 162,541 users), so that code whose memory grows with users x movies (an
    evaluation that builds dense masks, say) meets the real sizes offline. Every movie is rated at least
    once; a share `active_share` of the users rate `ratings_per_user` distinct movies (enough to hold some
    out for evaluation), the others 3. There is nothing a model can learn beyond popularity.
    """
    args = dict(kind="shaped", num_users=num_users, num_movies=num_movies, ratings_per_user=ratings_per_user,
                active_share=active_share, seed=seed, version=BUILD_VERSION)
    if num_users < 1 or not 3 <= ratings_per_user <= num_movies // 2 or not 0 <= active_share <= 1:
        raise ValueError(f"need num_users >= 1, 3 <= ratings_per_user ({ratings_per_user}) <= num_movies / 2 "
                         f"({num_movies // 2}) and 0 <= active_share ({active_share}) <= 1.")
    out = Path(out_dir) if out_dir is not None else cache_dir("movielens", _digest(args)[:12])
    ratings_csv, movies_csv = out / "ratings.csv", out / "movies.csv"

    def write() -> None:
        rng = np.random.default_rng(seed)
        popularity = 1.0 / np.arange(1, num_movies + 1)
        popularity = rng.permutation(popularity / popularity.sum())
        wanted = np.where(rng.random(num_users) < active_share, ratings_per_user, 3)
        users = np.repeat(np.arange(1, num_users + 1), 2 * wanted)   # twice the draws; duplicates dropped
        movies = rng.choice(num_movies, size=len(users), p=popularity)
        frame = pd.DataFrame({"userId": users, "movie": movies}).drop_duplicates(["userId", "movie"])
        frame = frame[frame.groupby("userId").cumcount().to_numpy() < wanted[frame["userId"].to_numpy() - 1]]
        unseen = np.setdiff1d(np.arange(num_movies), frame["movie"].to_numpy())   # every movie rated once
        frame = pd.concat([frame, pd.DataFrame({"userId": rng.integers(1, num_users + 1, size=len(unseen)),
                                                "movie": unseen})]).drop_duplicates(["userId", "movie"])
        movie_ids = np.sort(rng.choice(np.arange(1, 4 * num_movies + 1), size=num_movies, replace=False))
        start = 1_000_000_000 + rng.integers(0, 3 * 365 * 86400, size=num_users)
        stamps = start[frame["userId"].to_numpy() - 1] + rng.integers(60, 400 * 86400, size=len(frame))
        ratings = pd.DataFrame({"userId": frame["userId"].to_numpy(), "movieId": movie_ids[frame["movie"]],
                                "rating": rng.integers(1, 11, size=len(frame)) / 2, "timestamp": stamps})
        ratings.sort_values(["userId", "timestamp"], kind="stable").to_csv(ratings_csv, index=False)
        genres = np.array(GENRES)[rng.integers(0, len(GENRES), size=num_movies)]
        pd.DataFrame({"movieId": movie_ids, "title": [f"Movie {i} (2000)" for i in movie_ids],
                      "genres": genres}).to_csv(movies_csv, index=False)

    build = reuse_or_build(out, args, [ratings_csv, movies_csv], write, manifest=MANIFEST)
    return MovieLensFiles(ratings_csv, movies_csv, built=not build.reused)


def _make_tables(*, num_users: int, num_movies: int, min_ratings: int, max_ratings: int, factors: int,
                 taste: float, popularity: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The ratings and movies tables of `build_movielens` (its docstring says how they are made)."""
    rng = np.random.default_rng(seed)
    movie_factors = rng.standard_normal((num_movies, factors))
    user_factors = rng.standard_normal((num_users, factors))
    genre_dirs = rng.standard_normal((len(GENRES), factors))

    # Genres: the directions a movie's factors point to most, with noise; 1-3 per movie.
    genre_score = movie_factors @ genre_dirs.T / np.sqrt(factors) + 0.5 * rng.standard_normal(
        (num_movies, len(GENRES)))
    n_genres = rng.choice([1, 2, 3], size=num_movies, p=[0.35, 0.4, 0.25])
    top = np.argsort(-genre_score, axis=1)
    genres = ["|".join(GENRES[g] for g in sorted(top[m, : n_genres[m]])) for m in range(num_movies)]

    # Popularity: Zipf-like bias over a random order of the movies.
    rank = rng.permutation(num_movies) + 1
    bias = -np.log(rank)
    bias -= bias.mean()

    movie_ids = np.sort(rng.choice(np.arange(1, 4 * num_movies + 1), size=num_movies, replace=False))
    years = rng.integers(1950, 2020, size=num_movies)
    titles = [f"The {_ADJECTIVES[rng.integers(len(_ADJECTIVES))]} {_NOUNS[rng.integers(len(_NOUNS))]} "
              f"{i + 1} ({years[i]})" for i in range(num_movies)]

    counts = np.minimum(np.floor(min_ratings * np.exp(rng.exponential(0.6, size=num_users))).astype(int),
                        max_ratings)
    affinity = user_factors @ movie_factors.T / np.sqrt(factors)
    logits = taste * affinity + popularity * bias
    rows = []
    start = 1_000_000_000  # 2001-09-09: timestamps in seconds, as in MovieLens
    for u in range(num_users):
        gumbel = -np.log(-np.log(rng.random(num_movies)))
        chosen = np.argsort(-(logits[u] + gumbel))[: counts[u]]  # sampling without replacement
        chosen = rng.permutation(chosen)                         # time order independent of taste
        t0 = start + int(rng.integers(0, 3 * 365 * 86400))
        times = t0 + np.cumsum(rng.integers(60, 7 * 86400, size=len(chosen)))
        stars = np.clip(np.round((3.4 + 0.9 * affinity[u, chosen] + 0.5 * rng.standard_normal(len(chosen)))
                                 * 2) / 2, 0.5, 5.0)
        rows.append(pd.DataFrame({"userId": u + 1, "movieId": movie_ids[chosen], "rating": stars,
                                  "timestamp": times}))
    ratings = pd.concat(rows, ignore_index=True).sort_values(["userId", "timestamp"], kind="stable")
    return ratings, pd.DataFrame({"movieId": movie_ids, "title": titles, "genres": genres})


def validate_ratings(ratings: pd.DataFrame, source: str = "ratings") -> pd.DataFrame:
    """Check a ratings table is in MovieLens format; return it with integer ids. Raise what to fix if not."""
    missing = [c for c in RATINGS_COLUMNS if c not in ratings.columns]
    if missing:
        raise MovieLensFormatError(
            f"{source} is missing column(s) {missing}; it has {list(ratings.columns)[:10]}. A MovieLens "
            f"ratings.csv has the header {','.join(RATINGS_COLUMNS)}: rename your columns to these names.")
    if len(ratings) == 0:
        raise MovieLensFormatError(f"{source} has no rows.")
    out = ratings.copy()
    for col in ("userId", "movieId", "timestamp"):
        out[col] = _as_int(out[col], col, source)
    rating = pd.to_numeric(out["rating"], errors="coerce")
    if rating.isna().any():
        bad = out.loc[rating.isna(), "rating"].head(3).tolist()
        raise MovieLensFormatError(f"{source}: column 'rating' has non-numeric values, e.g. {bad}.")
    out["rating"] = rating.astype(np.float32)
    duplicated = out.duplicated(["userId", "movieId", "timestamp"])
    if duplicated.any():
        raise MovieLensFormatError(f"{source} has {int(duplicated.sum())} duplicate (userId, movieId, "
                                   "timestamp) rows: drop them first (ratings.drop_duplicates()).")
    return out


def validate_movies(movies: pd.DataFrame, source: str = "movies") -> pd.DataFrame:
    """Check a movies table (movieId,title,genres with '|'-separated genres); return it with integer ids."""
    missing = [c for c in MOVIES_COLUMNS if c not in movies.columns]
    if missing:
        raise MovieLensFormatError(
            f"{source} is missing column(s) {missing}; it has {list(movies.columns)[:10]}. A MovieLens "
            f"movies.csv has the header {','.join(MOVIES_COLUMNS)}.")
    out = movies.copy()
    out["movieId"] = _as_int(out["movieId"], "movieId", source)
    if out["movieId"].duplicated().any():
        raise MovieLensFormatError(f"{source}: movieId values repeat, e.g. "
                                   f"{out.loc[out['movieId'].duplicated(), 'movieId'].head(3).tolist()}.")
    out["genres"] = out["genres"].fillna("(no genres listed)").astype(str)
    return out


def movielens_files(data_path: str | Path) -> MovieLensFiles:
    """The `ratings.csv` and `movies.csv` of a MovieLens folder (an unzipped download: ml-latest-small,
    ml-25m, ...); raise what to fix when one is missing."""
    folder = Path(data_path)
    files = MovieLensFiles(folder / "ratings.csv", folder / "movies.csv", built=False)
    missing = [p.name for p in (files.ratings_csv, files.movies_csv) if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"data_path={str(data_path)!r} has no {' or '.join(missing)}: point it at an "
                                "unzipped MovieLens download (ml-latest-small, ml-25m, ...), or set "
                                "data_path=None for the built-in data.")
    return files


def read_movielens(ratings_csv: str | Path, movies_csv: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read and check a MovieLens ratings.csv / movies.csv pair (a real download or `build_movielens`)."""
    for path in (ratings_csv, movies_csv):
        if not Path(path).is_file():
            raise FileNotFoundError(f"{path} does not exist: point ratings_csv/movies_csv at a MovieLens "
                                    "download (e.g. ml-latest-small/ratings.csv), or set both to None.")
    ratings = validate_ratings(pd.read_csv(ratings_csv), str(ratings_csv))
    movies = validate_movies(pd.read_csv(movies_csv), str(movies_csv))
    unknown = ~ratings["movieId"].isin(movies["movieId"])
    if unknown.any():
        examples = ratings.loc[unknown, "movieId"].head(3).tolist()
        raise MovieLensFormatError(f"{ratings_csv}: {int(unknown.sum())} ratings name movies absent from "
                                   f"{movies_csv}, e.g. movieId {examples}.")
    return ratings, movies


def split_by_time(ratings: pd.DataFrame, holdout: int = 3,
                  min_train: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Hold out each user's `holdout` latest interactions (leave-future-out), keep the earlier ones for
    training.

    Users with fewer than `holdout + min_train` interactions stay entirely in training (too little history
    to evaluate them fairly). Ties in time are broken by row order, so the split is deterministic.
    """
    if holdout < 1:
        raise ValueError(f"holdout={holdout} must be at least 1.")
    ordered = ratings.reset_index(drop=True)
    ordered = ordered.assign(_row=np.arange(len(ordered))).sort_values(["userId", "timestamp", "_row"],
                                                                       kind="stable")
    from_end = ordered.groupby("userId").cumcount(ascending=False)
    size = ordered.groupby("userId")["movieId"].transform("size")
    held = (from_end < holdout) & (size >= holdout + min_train)
    train = ordered[~held].drop(columns="_row").reset_index(drop=True)
    test = ordered[held].drop(columns="_row").reset_index(drop=True)
    return train, test


@dataclass(frozen=True)
class Interactions:
    """Ratings split by time per user, with contiguous indices and genre features (`prepare_interactions`).

    `train` and `test` keep the ratings' columns and add `user` and `movie`, the contiguous indices: a user's
    index is its position in `user_ids` (sorted userIds), a movie's is its row in movies.csv (`movie_ids`)."""

    train: pd.DataFrame
    test: pd.DataFrame
    user_ids: np.ndarray       # userId of each user index
    movie_ids: np.ndarray      # movieId of each movie index
    genres: list[str]          # the genre names, sorted: the columns of the feature tables
    movie_genres: np.ndarray   # float32 (movies, genres): each movie's genres, multi-hot
    user_genres: np.ndarray    # float32 (users, genres): each genre's share of the user's training movies
    item_counts: np.ndarray    # training interactions of each movie

    def training_samples(self) -> pd.DataFrame:
        """One row per training interaction with its features, denormalised as a production pipeline writes
        them, and `row`, its number (which proves that ranks read disjoint samples)."""
        train = self.train
        return pd.DataFrame({
            "row": np.arange(len(train)), "user": train.user.astype(np.int32),
            "movie": train.movie.astype(np.int32), "rating": train.rating.astype(np.float32),
            "timestamp": train.timestamp, "user_genres": list(self.user_genres[train.user]),
            "movie_genres": list(self.movie_genres[train.movie])})


def prepare_interactions(ratings: pd.DataFrame, movies: pd.DataFrame, holdout: int = 3) -> Interactions:
    """Split `ratings` by time per user (`split_by_time`), map ids to contiguous indices (MovieLens movie ids
    have gaps) and build the features: a movie's genres (multi-hot) and a user's genre profile, the share of
    each genre among the movies they watched **in training**, so nothing of the held-out future leaks in.

    Raises if a held-out interaction precedes its user's training ones, or repeats a training pair.
    """
    train_df, test_df = split_by_time(ratings, holdout=holdout)
    last_train = train_df.groupby("userId").timestamp.max()
    first_test = test_df.groupby("userId").timestamp.min()
    if not (first_test >= last_train.reindex(first_test.index)).all():
        raise AssertionError("a held-out interaction precedes its user's training interactions")
    if train_df.merge(test_df, on=["userId", "movieId"]).shape[0]:
        raise AssertionError("a held-out (user, movie) pair also appears in training")
    movie_index = pd.Series(np.arange(len(movies)), index=movies.movieId.to_numpy())
    user_ids = np.sort(ratings.userId.unique())
    user_index = pd.Series(np.arange(len(user_ids)), index=user_ids)
    genres = sorted({g for gs in movies.genres for g in gs.split("|")})
    movie_genres = np.array([[g in gs.split("|") for g in genres] for gs in movies.genres], dtype=np.float32)
    train_df = train_df.assign(user=user_index[train_df.userId].to_numpy(),
                               movie=movie_index[train_df.movieId].to_numpy())
    test_df = test_df.assign(user=user_index[test_df.userId].to_numpy(),
                             movie=movie_index[test_df.movieId].to_numpy())
    user_genres = np.zeros((len(user_ids), len(genres)), dtype=np.float32)
    np.add.at(user_genres, train_df.user.to_numpy(), movie_genres[train_df.movie.to_numpy()])
    user_genres /= np.maximum(user_genres.sum(1, keepdims=True), 1)
    item_counts = np.bincount(train_df.movie, minlength=len(movies))
    return Interactions(train_df, test_df, user_ids, movies.movieId.to_numpy(), genres, movie_genres,
                        user_genres, item_counts)


# --- MDS -------------------------------------------------------------------------------------------------

_NUMPY_FOR_ENCODING = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
                       "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
                       "float16": np.float16, "float32": np.float32, "float64": np.float64}


@dataclass(frozen=True)
class MDSInfo:
    path: Path
    samples: int
    shards: list[dict[str, Any]]  # one row per shard: file, samples, bytes (on disk), raw_bytes
    reused: bool                  # True: an identical earlier conversion was kept
    replaced: bool                # True: an older, different conversion was deleted and rewritten

    @property
    def total_bytes(self) -> int:
        return sum(s["bytes"] for s in self.shards)

    def batches(self, batch_size: int) -> int:
        """The batches of an epoch over these samples at a global `batch_size` (the last one may be short)."""
        return -(-self.samples // batch_size)

    def index_summary(self) -> str:
        """The start of the `index.json` that `StreamingDataset` reads: its version and what the first shard's
        entry says (columns and their encodings, compression, hashes, samples, size limit, file)."""
        index = json.loads((self.path / "index.json").read_text())
        first = index["shards"][0]
        keys = ("column_names", "column_encodings", "compression", "hashes", "samples", "size_limit",
                "zip_data")
        shown = {k: first[k] for k in keys if k in first}
        return json.dumps({"version": index["version"], "shards[0]": shown}, indent=1)


def validate_for_mds(frame: pd.DataFrame, columns: dict[str, str]) -> None:
    """Check every column exists, has the encoding's type and no missing values, before writing anything."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise MovieLensFormatError(f"cannot write MDS: the table lacks column(s) {missing} "
                                   f"(it has {list(frame.columns)}).")
    for name, encoding in columns.items():
        kind = encoding.split(":")[0]
        values = frame[name]
        if kind in _NUMPY_FOR_ENCODING:
            if not (pd.api.types.is_integer_dtype(values) or pd.api.types.is_float_dtype(values)):
                raise MovieLensFormatError(f"cannot write MDS: column {name!r} ({values.dtype}) is not "
                                           f"numeric but its encoding is {encoding!r}.")
            if values.isna().any():
                raise MovieLensFormatError(f"cannot write MDS: column {name!r} has missing values.")
            if kind.startswith(("int", "uint")) and not pd.api.types.is_integer_dtype(values):
                raise MovieLensFormatError(f"cannot write MDS: column {name!r} holds {values.dtype} values "
                                           f"but its encoding {encoding!r} is an integer type: convert it "
                                           "first.")
        elif kind == "ndarray":
            first = values.iloc[0] if len(values) else None
            if not isinstance(first, np.ndarray):
                raise MovieLensFormatError(f"cannot write MDS: column {name!r} must hold numpy arrays "
                                           f"for encoding {encoding!r}, got {type(first).__name__}.")


def write_mds(frame: pd.DataFrame, out_dir: str | Path, columns: dict[str, str], *,
              compression: str | None = "zstd", hashes: tuple[str, ...] = ("sha1", "xxh64"),
              size_limit: int | str = "256kb", existing: Literal["reuse", "rebuild", "error"] = "reuse",
              ) -> MDSInfo:
    """Write `frame` as MDS shards with explicit column encodings; deal with an existing `out_dir` on purpose.

    `existing` says what to do with a directory already there:
    * "reuse": keep it if it holds this exact data written with these settings (same fingerprint in its
      `build.json`); replace it as a whole if it is an older conversion of ours with other data/settings;
    * "rebuild": always replace it;
    * "error": refuse if it exists with other contents.
    A directory this module did not write (no `build.json`) is never deleted: you are told to move it.
    Shards are written to a sibling temporary folder and renamed into place at the end, so a crash mid-way
    leaves the old directory intact and never a mix of old and new shards.
    """
    from streaming import MDSWriter

    validate_for_mds(frame, columns)  # before anything touches the disk
    out = Path(out_dir)
    settings = dict(columns=columns, compression=compression, hashes=list(hashes), size_limit=size_limit)
    fingerprint = _frame_digest(frame[list(columns)], settings)
    replaced = False
    if out.exists() and any(out.iterdir()):
        manifest = _read_json(out / MANIFEST)
        ours = isinstance(manifest, dict) and "fingerprint" in manifest
        if not ours:
            raise FileExistsError(
                f"{out} exists and was not written by write_mds (no {MANIFEST}): it may hold another data "
                "set. Move or delete it yourself, or choose another output directory.")
        if existing == "reuse" and manifest["fingerprint"] == fingerprint and (out / "index.json").is_file():
            return _mds_info(out, reused=True, replaced=False)
        if existing == "error":
            raise FileExistsError(f"{out} holds an MDS conversion of other data or settings "
                                  f"(fingerprint {manifest['fingerprint'][:12]} != {fingerprint[:12]}): "
                                  "pass existing='rebuild' to replace it, or use another directory.")
        replaced = True

    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        values = {name: _column_values(frame[name], enc) for name, enc in columns.items()}
        with MDSWriter(out=str(tmp), columns=columns, compression=compression, hashes=list(hashes),
                       size_limit=size_limit) as writer:
            for i in range(len(frame)):
                writer.write({name: col[i] for name, col in values.items()})
        (tmp / MANIFEST).write_text(json.dumps(dict(settings, fingerprint=fingerprint, samples=len(frame)),
                                               indent=1, sort_keys=True))
        if replaced:
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if out.exists():
                out.rmdir()  # empty
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _mds_info(out, reused=False, replaced=replaced)


def _column_values(series: pd.Series, encoding: str) -> list:
    kind = encoding.split(":")[0]
    if kind in _NUMPY_FOR_ENCODING:
        return series.to_numpy(_NUMPY_FOR_ENCODING[kind]).tolist()
    if kind == "ndarray":
        parts = encoding.split(":")
        dtype = _NUMPY_FOR_ENCODING.get(parts[1]) if len(parts) > 1 else None
        return [np.ascontiguousarray(v, dtype=dtype) for v in series]
    return series.tolist()


def _mds_info(out: Path, reused: bool, replaced: bool) -> MDSInfo:
    index = json.loads((out / "index.json").read_text())
    shards = []
    for shard in index["shards"]:
        stored = shard.get("zip_data") or shard["raw_data"]
        shards.append({"file": stored["basename"], "samples": shard["samples"], "bytes": stored["bytes"],
                       "raw_bytes": shard["raw_data"]["bytes"]})
    return MDSInfo(out, sum(s["samples"] for s in shards), shards, reused=reused, replaced=replaced)


def _as_int(values: pd.Series, col: str, source: str) -> pd.Series:
    if pd.api.types.is_integer_dtype(values):
        return values.astype(np.int64)
    numeric = pd.to_numeric(values, errors="coerce")
    bad = numeric.isna() | (numeric != np.floor(numeric))
    if bad.any():
        examples = values[bad].head(3).tolist()
        raise MovieLensFormatError(
            f"{source}: column {col!r} must hold integer ids, but {int(bad.sum())} value(s) are not, e.g. "
            f"{examples}. MovieLens ids are whole numbers: map your ids to integers first "
            f"(e.g. ratings['{col}'] = ratings['{col}'].astype('category').cat.codes + 1).")
    return numeric.astype(np.int64)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _frame_digest(frame: pd.DataFrame, settings: dict) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    h.update(str(len(frame)).encode())
    for name in frame.columns:
        h.update(name.encode())
        column = frame[name]
        if column.dtype == object:
            for v in column:
                h.update(np.ascontiguousarray(v).tobytes() if isinstance(v, np.ndarray) else repr(v).encode())
        else:
            h.update(column.to_numpy().tobytes())
    return h.hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
