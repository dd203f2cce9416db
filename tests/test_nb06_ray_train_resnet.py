"""Notebook 06 under papermill, on the paths the stored (nbval) run does not take.

nbval re-executes the stored notebook at its defaults: the offline data set built by helpers, a worker
killed in epoch 2 and the run resumed from the checkpoint, the default MLflow store, a private local Ray
instance. The scale-up run in test_scale_up.py takes the other paths: no failure, a `data_dir` holding
FashionMNIST's IDX files at full size, `storage_path`, an MLflow store given by `tracking_uri`, 4 workers on a
Ray cluster started outside the notebook. Here: a bad parameter refused before Ray starts.
"""

import pytest

pytestmark = pytest.mark.notebook



def test_bad_fail_at_epoch_is_refused_before_training(refusals):
    [refusal] = refusals("06_ray_train_resnet", {"fail_at_epoch": 1})
    assert "must be None or between 2 and epochs" in refusal.error
