"""Notebook 05 under papermill with parameters other than the stored defaults.

The stored notebook (ZeRO-3 on 2 processes) is executed by nbval; this file runs the other stage the
issue asks for, ZeRO-2 on 2 processes, at the smallest size where the notebook's own checks (held-out
accuracy bar, stage parity, sharding) still hold, and the bad-input case that must fail before any launch.
A dataset file with a missing field is tested on the validation function itself
(tests/test_data_sft_tasks.py).
"""

import pytest

from tests.conftest import stream_text

pytestmark = pytest.mark.notebook


def test_zero_stage_2_two_processes(run_notebook):
    nb, metrics = run_notebook("05_deepspeed_zero_sft", zero_stage=2, processes=2, n_test=100, parity_steps=2)
    assert metrics["zero_stage"] == 2 and metrics["processes"] == 2
    assert metrics["accuracy_after"] >= 0.8 > 0.05 > metrics["accuracy_before"]
    assert metrics["parity_max_abs_diff"] < 1e-4
    out = stream_text(nb)
    assert "[rank1] rank 1/2: holds" in out  # both ranks ran and reported to the cell
    assert "ZeRO-2: 400 steps" in out


def test_unknown_zero_stage_fails_before_launch(run_notebook):
    from papermill.exceptions import PapermillExecutionError

    with pytest.raises(PapermillExecutionError, match="zero_stage=4 is not a DeepSpeed ZeRO stage") as info:
        run_notebook("05_deepspeed_zero_sft", zero_stage=4)
    assert "[rank" not in str(info.value)  # nothing was launched
