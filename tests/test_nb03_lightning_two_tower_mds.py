"""Notebook 03 under papermill with parameters other than the stored defaults.

The defaults (processes='auto' = 2 CPU processes here) are covered by nbval over notebooks/, the scale-up
run (ml-25m's shape, bigger batches and embeddings, an MLflow store given by `tracking_uri`) by
test_scale_up.py. This file: a bad ratings file, which must fail in the notebook before any MDS shard is
written (the builder and MDS helpers are tested directly in tests/test_data_movielens.py), and a run on the
two-node Ray cluster whose trained model is registered by name with tracking on, then loaded from the
registry by a fresh process.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from helpers import tracking

pytestmark = pytest.mark.notebook

# A third process: MLflow's pyfunc loader and the registry, nothing of the notebook or of helpers
_RANK_BY_NAME = textwrap.dedent("""
    import json, sys
    import mlflow
    import numpy as np

    mlflow.set_tracking_uri(sys.argv[1])
    model = mlflow.pyfunc.load_model(sys.argv[2])
    scores = np.asarray(model.predict(model.input_example))
    print(json.dumps((-scores).argsort(1, kind="stable").tolist()))
""")


def test_the_registered_model_ranks_in_a_fresh_process_as_the_notebook_did(run_notebook, registry, tmp_path,
                                                                          two_node_cluster):
    """Trained on the two-node Ray cluster (one rank per node) through Ray Train's Lightning integration, then
    registered by name into Lightning's run; a process with MLflow alone loads it from the registry and
    ranks every movie for the input example's users: the notebook's top 10 of each (seen movies left out) is
    that ranking with only the user's seen movies skipped, so it appears there in the same order."""
    _, metrics = run_notebook("03_lightning_two_tower_mds", num_users=200, num_movies=100, eval_users=50,
                              epochs=1, max_steps=4, run_parity=False, register_as="two-tower",
                              mds_dir=str(tmp_path / "mds"), cluster=two_node_cluster.address)
    assert metrics["nodes"] == 2
    assert metrics["strategy"] == "RayDDPStrategy"                      # Ray Train's Lightning integration
    assert metrics["cluster_environment"] == "RayLightningEnvironment"
    assert metrics["logged_model_uri"] == "models:/two-tower/1"
    answers = [[int(m) for m in top.split()] for top in metrics["logged_model_answers"].split(" | ")]
    done = subprocess.run([sys.executable, "-c", _RANK_BY_NAME, registry, "models:/two-tower/1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rankings = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(rankings) == len(answers) == 5
    for top, ranking in zip(answers, rankings, strict=True):
        positions = [ranking.index(m) for m in top]
        assert positions == sorted(positions), (top, ranking[:20])
    client = tracking.client_for(registry)
    runs = client.search_runs([client.get_experiment_by_name("03_lightning_two_tower_mds").experiment_id])
    assert len(runs) == 1, "one notebook run, one MLflow run"


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
                              dict(data_path=str(bad_column), mds_dir=str(tmp_path / "mds")),
                              dict(data_path=str(no_movies), mds_dir=str(tmp_path / "mds")))
    assert "missing column(s) ['userId']" in column.error
    assert "has no movies.csv" in movies.error
    assert not (tmp_path / "mds").exists(), "MDS shards were written from bad input"
