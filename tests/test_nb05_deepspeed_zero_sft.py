"""Notebook 05 under papermill with parameters other than the stored defaults.

The stored notebook (ZeRO-3 on 2 processes) is executed by nbval, with its learning bars and reference run;
this file runs ZeRO-3 on a two-node Ray cluster (one rank per node) for a few fine-tuning steps (`max_steps`),
without the stage-parity runs (nbval's run compares stages 0-3 on one machine). And the bad-input cases that
must fail before any launch.
A dataset file with a missing field is tested on the validation function itself (test_data_sft_tasks.py).
"""

import pytest

from tests.support import stream_text

pytestmark = pytest.mark.notebook


def test_zero_stage_3_on_two_nodes(run_notebook, two_node_cluster):
    """ZeRO-3 with one rank on each node of a two-node Ray cluster: DeepSpeed joins the ranks' group."""
    nb, metrics = run_notebook("05_deepspeed_zero_sft", zero_stage=3, processes=2, n_train=400, n_test=20,
                               run_parity=False, max_steps=8, cluster=two_node_cluster.address)
    assert metrics["zero_stage"] == 3 and metrics["processes"] == 2
    assert metrics["nodes"] == 2
    out = stream_text(nb)
    assert "2 ranks ran on 2 node(s)" in out
    assert "[rank1] rank 1/2: holds" in out  # both ranks ran and reported to the cell
    assert "ZeRO-3: 8 steps" in out


# (a bad max_steps: tests/test_nb01_ddp_mlp.py runs it, test_notebook_conventions.py checks every notebook
# calls the same check before its first launch)
def test_bad_settings_fail_before_launch(refusals, tmp_path):
    """A ZeRO stage that does not exist; a model folder without a tokenizer."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    stage, tokenizer = refusals("05_deepspeed_zero_sft", {"zero_stage": 4},
                                {"model_name": str(tmp_path / "model")})
    assert "zero_stage=4 is not a DeepSpeed ZeRO stage" in stage.error
    assert "holds a model but no tokenizer" in tokenizer.error
    assert "[rank" not in stage.output + tokenizer.output   # nothing was launched
