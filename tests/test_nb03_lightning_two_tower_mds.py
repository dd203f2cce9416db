"""Notebook 03 under papermill with parameters other than the stored defaults.

The defaults (processes='auto' = 2 CPU processes here) are covered by nbval over notebooks/, so this file
runs the other case: one process, for a few steps per epoch (`max_steps`; the learning bars and the
reference run belong to the default run), and a bad ratings file, which must fail in the notebook before
any MDS shard is written. The builder and MDS helpers are tested directly in
tests/test_data_movielens.py.
"""

import pytest

from tests.conftest import stream_text

pytestmark = pytest.mark.notebook


def test_one_process_one_mlflow_run(run_notebook, tmp_path, monkeypatch):
    """One process, tracking on through the environment: Lightning's logger and record_metrics, one run."""
    import mlflow

    store = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("GALLERY_TRACKING", "on")
    monkeypatch.setenv("GALLERY_TRACKING_URI", store)
    nb, metrics = run_notebook("03_lightning_two_tower_mds", processes=1, epochs=2, max_steps=10)
    client = mlflow.tracking.MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("03_lightning_two_tower_mds").experiment_id])
    assert len(runs) == 1, f"{len(runs)} MLflow runs for one notebook run"
    assert runs[0].data.metrics["recall_at_10"] == pytest.approx(metrics["recall_at_10"])
    # Lightning's logger wrote the per-epoch validation recall into the same run
    assert len(client.get_metric_history(runs[0].info.run_id, "val_recall_at_10")) == 2
    assert metrics["processes"] == 1
    assert 0 <= metrics["recall_at_10"] <= 1
    out = stream_text(nb)
    assert "[rank0] rank 0/1 on cpu" in out           # the rank's own line reached the cell, prefixed
    assert "cluster environment TorchElasticEnvironment" in out
    assert "Streaming segments left in /dev/shm: none" in out
    assert "MLflow holds the 2 validation recalls" in out


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
