"""Notebook 03 under papermill with parameters other than the stored defaults.

The defaults (processes='auto' = 2 CPU processes here) are covered by nbval over notebooks/, the scale-up
run (ml-25m's shape, bigger batches and embeddings, an MLflow store given by `tracking_uri`) by
test_scale_up.py. This file: a bad ratings file, which must fail in the notebook before any MDS shard is
written. The builder and MDS helpers are tested directly in
tests/test_data_movielens.py.
"""

import pytest

pytestmark = pytest.mark.notebook



def test_bad_ratings_fail_before_any_mds(refusals, tmp_path):
    from helpers.data.movielens import build_movielens

    good = build_movielens(tmp_path / "ml", num_users=30, num_movies=40, min_ratings=10, max_ratings=20)
    bad_column, no_movies = tmp_path / "bad", tmp_path / "no-movies"
    for folder in (bad_column, no_movies):
        folder.mkdir()
    (bad_column / "ratings.csv").write_text(good.ratings_csv.read_text().replace("userId,", "user,", 1))
    (bad_column / "movies.csv").write_text(good.movies_csv.read_text())
    (no_movies / "ratings.csv").write_text(good.ratings_csv.read_text())
    column, movies = refusals("03_lightning_two_tower_mds",
                              dict(data_dir=str(bad_column), mds_dir=str(tmp_path / "mds")),
                              dict(data_dir=str(no_movies), mds_dir=str(tmp_path / "mds")))
    assert "missing column(s) ['userId']" in column.error
    assert "has no movies.csv" in movies.error
    assert not (tmp_path / "mds").exists(), "MDS shards were written from bad input"
