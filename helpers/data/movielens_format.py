"""What a MovieLens download holds, and the checks that a table is in its format before anything is written.

`ratings.csv`: userId,movieId,rating,timestamp; `movies.csv`: movieId,title,genres ('|'-separated genres).
`read_movielens` reads and checks a pair of them (a real download or what `helpers.data.movielens` builds).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from helpers.paths import cache_dir

# The 18 genres of MovieLens (plus "(no genres listed)", which real files also use).
GENRES = ("Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War",
          "Western")
RATINGS_COLUMNS = ("userId", "movieId", "rating", "timestamp")
MOVIES_COLUMNS = ("movieId", "title", "genres")


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


def _require_columns(table: pd.DataFrame, columns: tuple[str, ...], source: str, file: str) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise MovieLensFormatError(
            f"{source} is missing column(s) {missing}; it has {list(table.columns)[:10]}. A MovieLens "
            f"{file} has the header {','.join(columns)}: rename your columns to these names.")


def validate_ratings(ratings: pd.DataFrame, source: str = "ratings") -> pd.DataFrame:
    """Check a ratings table is in MovieLens format; return it with integer ids. Raise what to fix if not."""
    _require_columns(ratings, RATINGS_COLUMNS, source, "ratings.csv")
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
    _require_columns(movies, MOVIES_COLUMNS, source, "movies.csv")
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
