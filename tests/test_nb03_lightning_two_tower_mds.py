"""Notebook 03 under papermill with parameters other than the stored defaults.

The defaults (processes='auto' = 2 CPU processes here) are covered by nbval over notebooks/, the scale-up
run (ml-25m's shape, bigger batches and embeddings, an MLflow store given by `tracking_uri`) by
test_scale_up.py. This file: a bad ratings file, which must fail in the notebook before any MDS shard is
written. The builder and MDS helpers are tested directly in
tests/test_data_movielens.py.
"""

import pytest

pytestmark = pytest.mark.notebook



def test_bad_ratings_fail_before_any_mds(run_notebook, tmp_path):
    from papermill.exceptions import PapermillExecutionError

    from helpers.data.movielens import build_movielens

    good = build_movielens(tmp_path / "ml", num_users=30, num_movies=40, min_ratings=10, max_ratings=20)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "ratings.csv").write_text(good.ratings_csv.read_text().replace("userId,", "user,", 1))
    (bad / "movies.csv").write_text(good.movies_csv.read_text())
    with pytest.raises(PapermillExecutionError, match=r"missing column\(s\) \['userId'\]"):
        run_notebook("03_lightning_two_tower_mds", data_dir=str(bad), mds_dir=str(tmp_path / "mds"))
    assert not (tmp_path / "mds").exists()
    with pytest.raises(PapermillExecutionError, match=r"has no movies.csv"):
        (bad / "movies.csv").unlink()
        run_notebook("03_lightning_two_tower_mds", data_dir=str(bad), mds_dir=str(tmp_path / "mds"))
