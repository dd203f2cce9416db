"""Notebook 01 under papermill with parameters other than the stored defaults.

The defaults (processes='auto' = 2 CPU processes here) are covered by nbval over notebooks/, so this
file runs the other cases: one process on a user's CSV, a broken training, bad input, and (make test-cluster)
every launch on the two-node Ray cluster. The notebook's own assertions (accuracy, 1-vs-N parity) run inside
it; a failing one fails the execution.
"""

import pytest

from tests.support import stream_text

pytestmark = pytest.mark.notebook


def test_one_process_on_a_user_csv(run_notebook, tmp_path):
    """One process, reading a user's CSV through data_path, given as the file itself (1,000 rows of the
    digits, so the split shows it was this file), trained in full: the 1-process path learns as the 2-process
    default does."""
    import pandas as pd
    from sklearn.datasets import load_digits

    digits = load_digits()
    frame = pd.DataFrame(digits.data, columns=[f"p{i}" for i in range(64)])
    frame["label"] = digits.target
    good = tmp_path / "good"
    good.mkdir()
    frame.head(1000).to_csv(good / "digits.csv", index=False)
    nb, metrics = run_notebook("01_ddp_mlp", processes=1, data_path=str(good / "digits.csv"))
    out = stream_text(nb)
    assert "train (800, 64), test (200, 64), 10 classes" in out
    assert metrics["processes"] == 1
    assert metrics["test_accuracy"] >= 0.95
    assert metrics["parity_max_abs_diff"] < 1e-3
    assert "[rank0] rank 0/1 on cpu" in out  # the rank's own line reached the cell, prefixed


def test_broken_training_fails_the_notebook(run_notebook):
    """The regression guard bites: with a learning rate of 1e-9 nothing is learned, and the checks say so (a
    learning rate of 0 is refused before anything runs)."""
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError, match="training loss did not fall"):
        run_notebook("01_ddp_mlp", lr=1e-9, epochs=2, parity_steps=2)


def test_bad_input_is_refused_before_launch(refusals, tmp_path):
    """A folder without digits.csv, and a step cap of 0: each fails with a message naming the fix."""
    missing, zero = refusals("01_ddp_mlp", {"data_path": str(tmp_path / "empty")}, {"max_steps": 0})
    assert "has no digits.csv" in missing.error
    assert "max_steps=0: set a whole number of steps" in zero.error
    assert "[rank" not in missing.output + zero.output   # nothing was launched


@pytest.mark.cluster
def test_two_nodes(run_notebook, two_node_cluster):
    """cluster=<address>: the training and both parity launches run as Ray workers, one rank per node; the
    arrays travel with the call (nothing to mark as shared). Capped at 6 steps: the checks that hold at any
    length run (parity 1 vs 2 ranks, driver == distributed evaluation, a new shuffle each epoch)."""
    nb, metrics = run_notebook("01_ddp_mlp", processes=2, cluster=two_node_cluster.address, epochs=2,
                               max_steps=6, parity_steps=4)
    out = stream_text(nb)
    assert metrics["nodes"] == 2
    assert "2 rank(s) ran on 2 node(s)" in out and "all checks passed" in out
    assert metrics["parity_max_abs_diff"] < 1e-3
    assert "[rank1] rank 1/2 on cpu" in out   # rank 1's own line came back from the other node
