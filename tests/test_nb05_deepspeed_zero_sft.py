"""Notebook 05 under papermill with parameters other than the stored defaults.

The stored notebook (ZeRO-3 on 2 processes) is executed by nbval, with its learning bars and reference run;
this file runs the other stage, ZeRO-2 on 2 processes, for a few fine-tuning steps (`max_steps`): stage
parity and sharding are checked inside the notebook at any size. And the bad-input cases that must fail
before any launch.
A dataset file with a missing field is tested on the validation function itself (test_data_sft_tasks.py).
"""

import pytest

from tests.conftest import stream_text

pytestmark = pytest.mark.notebook


def test_zero_stage_2_two_processes(run_notebook):
    nb, metrics = run_notebook("05_deepspeed_zero_sft", zero_stage=2, processes=2, n_test=20, parity_steps=2,
                               max_steps=12)
    assert metrics["zero_stage"] == 2 and metrics["processes"] == 2
    assert metrics["parity_max_abs_diff"] < 1e-4
    out = stream_text(nb)
    assert "[rank1] rank 1/2: holds" in out  # both ranks ran and reported to the cell
    assert "ZeRO-2: 12 steps" in out


# (a bad max_steps: tests/test_nb01_ddp_mlp.py runs it, test_notebook_conventions.py checks every notebook
# calls the same check before its first launch)
@pytest.mark.parametrize("bad, message", [({"zero_stage": 4}, "zero_stage=4 is not a DeepSpeed ZeRO stage")])
def test_bad_settings_fail_before_launch(run_notebook, bad, message):
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError, match=message) as info:
        run_notebook("05_deepspeed_zero_sft", **bad)
    assert "[rank" not in str(info.value)  # nothing was launched



def test_a_model_folder_without_tokenizer_fails_before_launch(run_notebook, tmp_path):
    from papermill.exceptions import PapermillExecutionError

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(PapermillExecutionError, match="holds a model but no tokenizer") as info:
        run_notebook("05_deepspeed_zero_sft", model_name=str(tmp_path / "model"))
    assert "[rank" not in str(info.value)
