"""Notebook 06 under papermill, on the paths the stored (nbval) run does not take.

nbval re-executes the stored notebook at its defaults: the offline data set built by helpers, a worker
killed in epoch 2 and the run resumed from the checkpoint, the default MLflow store, a private local Ray
instance. The scale-up run in test_scale_up.py takes the other paths: no failure, a `data_path` holding
FashionMNIST's IDX files at full size, `output_dir`, an MLflow store given by `tracking_uri`, 4 workers on a
Ray cluster started outside the notebook. Here: a bad parameter refused before Ray starts, the chosen
model registered by name with tracking on, then loaded from the registry by a fresh process, and (make
test-cluster) the run on a Ray cluster of two nodes, the worker-loss demo included.
"""

import pytest

from tests.support import greedy_answers_by_name

pytestmark = pytest.mark.notebook


def test_the_registered_model_answers_in_a_fresh_process_as_the_notebook_did(run_notebook, registry):
    _, metrics = run_notebook("06_ray_train_resnet", epochs=1, max_steps=2, fail_at_epoch=None,
                              n_train=256, n_val=64, n_test=64, register_as="fashion-resnet")
    assert metrics["logged_model_uri"] == "models:/fashion-resnet/1"
    answers = [int(a) for a in metrics["logged_model_answers"].split()]
    assert greedy_answers_by_name(registry, "models:/fashion-resnet/1") == answers



def test_bad_fail_at_epoch_is_refused_before_training(refusals):
    [refusal] = refusals("06_ray_train_resnet", {"fail_at_epoch": 1})
    assert "must be None or between 2 and epochs" in refusal.error


@pytest.mark.cluster
def test_on_two_nodes_one_worker_each_and_the_lost_worker_resumes(run_notebook, two_node_cluster):
    """On a Ray cluster of two 1-CPU nodes (`cluster` = its address), at the defaults: each worker on a node
    of its own, the storage folder seen by both before training, and the worker-loss demo: the run resumes
    from the checkpoint of epoch 1 on a new worker group and passes the notebook's checks (the restored
    state, the accuracy bar, the reference runs). Smaller runs stop short of the accuracy bar, and
    max_steps, which would lift it, leaves too few steps for the crash demo."""
    _, metrics = run_notebook("06_ray_train_resnet", cluster=two_node_cluster.address)
    assert metrics["nodes"] == 2
    assert metrics["workers"] == 2
    assert metrics["recovered_from_failure"]
