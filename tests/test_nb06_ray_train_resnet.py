"""Notebook 06 under papermill, on the paths the stored (nbval) run does not take.

nbval re-executes the stored notebook at its defaults: the offline data set built by helpers, a worker
killed in epoch 2 and the run resumed from the checkpoint, the default MLflow store, a private local Ray
instance. Here: the same notebook with no failure, a `data_dir` holding FashionMNIST IDX files, an explicit
MLflow store (read back afterwards), for a few steps (`max_steps`: the path, not the learning, is under test),
and a bad parameter refused before Ray starts.
"""

import pytest

pytestmark = pytest.mark.notebook


def test_no_failure_user_data_and_tracking_store(run_notebook, tmp_path, monkeypatch):
    import mlflow

    from helpers.data import fashion_idx

    data_dir = fashion_idx.build(tmp_path / "fashion", train_size=2000, test_size=500, seed=7)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("GALLERY_TRACKING", "on")
    monkeypatch.setenv("GALLERY_TRACKING_URI", store)   # the environment, as the gallery runner sets it
    nb, metrics = run_notebook("06_ray_train_resnet", fail_at_epoch=None, epochs=2, data_dir=str(data_dir),
                               test_size=500, storage_path=str(tmp_path / "ray-storage"), max_steps=6)
    assert (tmp_path / "ray-storage" / "training").is_dir()   # Ray Train kept the run where it was told
    assert metrics["recovered_from_failure"] is False
    assert 0 <= metrics["test_accuracy"] <= 1
    runs = mlflow.tracking.MlflowClient(store).search_runs(
        [mlflow.tracking.MlflowClient(store).get_experiment_by_name("06_ray_train_resnet").experiment_id])
    assert len(runs) == 1 and runs[0].data.params["fail_at_epoch"] == "None"
    assert runs[0].data.metrics["test_accuracy"] == pytest.approx(metrics["test_accuracy"])


def test_bad_fail_at_epoch_is_refused_before_training(run_notebook):
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError, match="must be None or between 2 and epochs"):
        run_notebook("06_ray_train_resnet", fail_at_epoch=1)
