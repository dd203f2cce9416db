"""Ratings in MovieLens format, built offline, and their conversion to MosaicML Streaming (MDS) shards.

Notebook 03 trains a two-tower recommender on MovieLens (`ratings.csv`: userId,movieId,rating,timestamp;
`movies.csv`: movieId,title,genres). Nothing can be downloaded at run time, so `build_movielens` writes
a small data set in exactly that format, with structure a model can learn and a baseline cannot fully
exploit: every user and movie has hidden taste factors, genres follow those factors, a popularity skew
makes "most popular" a fair baseline, and timestamps are independent of taste so that holding out each
user's latest interactions tests generalisation to the future, not to a different distribution.

A real MovieLens download is read and checked by `read_movielens` (helpers/data/movielens_format.py) and
the training samples become MDS shards with `write_mds` (helpers/data/mds.py); both are importable from
here too. This module splits ratings by time per user (`split_by_time`) and prepares the interactions a
model trains on (`prepare_interactions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from helpers.data.builds import digest, reuse_or_build
from helpers.data.mds import MDSInfo, validate_for_mds, write_mds
from helpers.data.movielens_format import (
    GENRES,
    MOVIES_COLUMNS,
    RATINGS_COLUMNS,
    MovieLensFiles,
    MovieLensFormatError,
    movielens_files,
    read_movielens,
    validate_movies,
    validate_ratings,
)
from helpers.paths import cache_dir

__all__ = ["BUILD_VERSION", "GENRES", "ML25M_MOVIES", "ML25M_USERS", "MOVIES_COLUMNS", "MANIFEST",
           "RATINGS_COLUMNS", "Interactions", "MDSInfo", "MovieLensFiles", "MovieLensFormatError",
           "build_movielens", "build_movielens_shaped", "movielens_files", "prepare_interactions",
           "read_movielens", "split_by_time", "validate_for_mds", "validate_movies", "validate_ratings",
           "write_mds"]

BUILD_VERSION = 1  # bump when the generator changes, so cached builds are not reused
MANIFEST = "build.json"

_ADJECTIVES = ("Silent", "Broken", "Golden", "Last", "Hidden", "Crimson", "Endless", "Wild", "Lost", "Iron",
               "Midnight", "Frozen", "Burning", "Secret", "Distant", "Electric", "Hollow", "Savage")
_NOUNS = ("River", "Empire", "Garden", "Signal", "Harbor", "Machine", "Kingdom", "Shadow", "Island",
          "Letter", "Storm", "Station", "Mirror", "Frontier", "Orchard", "Circus", "Voyage", "Witness")


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
    out = Path(out_dir) if out_dir is not None else cache_dir("movielens", digest(args, 12))
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
    out = Path(out_dir) if out_dir is not None else cache_dir("movielens", digest(args, 12))
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
