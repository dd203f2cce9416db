"""Every notebook logs its trained model to MLflow, and `register_as` registers it: a model registered by one
notebook run is loaded by name in a fresh process, from the registry alone, and gives the notebook's answers.

The notebook runs here are the registry path (tracking on, a SQLite store in tmp_path); nbval runs every
notebook with tracking off, which saves the same model files locally and loads them back.
"""

from __future__ import annotations

import json

import pytest

from helpers import tracking
from tests.support import greedy_answers_by_name, text_answers_by_name


def test_a_registry_name_is_checked_before_training(monkeypatch):
    tracking.check_register_as(None)
    monkeypatch.setenv(tracking.ENV_SWITCH, "on")
    tracking.check_register_as("digits-mlp")
    for bad in ("", "a/b", "models:/x", 3):
        with pytest.raises(ValueError, match="give the name to register"):
            tracking.check_register_as(bad)
    monkeypatch.setenv(tracking.ENV_SWITCH, "off")
    with pytest.raises(ValueError, match="tracking is off .* unset GALLERY_TRACKING"):
        tracking.check_register_as("digits-mlp")


def test_the_uri_is_the_registry_s_when_registered():
    class Info:
        model_uri = "models:/m-123"
        registered_model_version = 4

    assert tracking.logged_model_uri(Info(), "digits-mlp") == "models:/digits-mlp/4"
    assert tracking.logged_model_uri(Info(), None) == "models:/m-123"


@pytest.mark.notebook
def test_01_registers_its_model_and_a_fresh_process_loads_it_by_name(run_notebook, registry):
    _, metrics = run_notebook("01_ddp_mlp", processes=1, epochs=1, max_steps=30, parity_steps=2,
                              register_as="digits-mlp")
    assert metrics["logged_model_uri"] == "models:/digits-mlp/1"
    answers = [int(a) for a in metrics["logged_model_answers"].split()]
    assert greedy_answers_by_name(registry, "models:/digits-mlp/1") == answers


@pytest.mark.notebook
def test_05_registers_its_model_and_a_fresh_process_loads_it_by_name(run_notebook, registry):
    # one process, 30 steps: answers that differ from the untrained model's (all empty), no stage-parity runs
    _, metrics = run_notebook("05_deepspeed_zero_sft", processes=1, n_train=128, n_test=8, epochs=1,
                              max_steps=30, run_parity=False, register_as="sft-tiny-llama")
    assert metrics["logged_model_uri"] == "models:/sft-tiny-llama/1"
    answers = json.loads(metrics["logged_model_answers"])
    assert len(answers) == 8 and any(answers), answers   # something to reproduce
    assert text_answers_by_name(registry, "models:/sft-tiny-llama/1") == answers
