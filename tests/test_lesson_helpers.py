"""The helpers every lesson calls by one line: its parameters as run, the settings check, the step harness and
the MLflow round trip of the trained model. Each check is shown failing on the input it exists for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import tracking
from helpers.parameters import literal_assignments, parameters_from_history
from helpers.settings import check_choice, check_local_checkpoint, check_lora, check_settings, check_whole


def test_parameters_are_the_first_literal_cell_then_what_papermill_injected():
    history = ["", 'processes = "auto"   # ranks\nseed = 0\ndata_path = None\n', "import torch",
               "BAR = 0.8", "# Parameters\nseed = 3\n", "x = seed + 1"]
    assert parameters_from_history(history) == {"processes": "auto", "seed": 3, "data_path": None}
    # an edited parameters cell run again wins; a later literal cell of other names is not a parameter
    assert parameters_from_history(history + ["seed = 5\nprocesses = 2"])["seed"] == 5
    assert "BAR" not in parameters_from_history(history)
    assert literal_assignments("a = [1, 2]\nb: int = 3") == {"a": [1, 2], "b": 3}
    assert literal_assignments("a = f(1)") is None and literal_assignments("print(1)") is None
    assert parameters_from_history(["import os"]) == {}


def test_without_history_the_parameters_are_the_first_names_the_notebook_set():
    """nbval runs cells with store_history=False: the namespace's order stands in for the history."""
    from helpers.parameters import parameters_from_namespace

    namespace = {"In": [], "_": None, "__name__": "__main__", "processes": "auto", "seed": 3,
                 "targets": ["q_proj"], "os": __import__("os"), "later": 1}
    assert parameters_from_namespace(namespace, hidden={"In"}) == {"processes": "auto", "seed": 3,
                                                                   "targets": ["q_proj"]}
    assert parameters_from_namespace({"os": namespace["os"], "x": 1}) == {}


def test_settings_are_refused_with_the_fix(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    good = {"processes": 2, "epochs": 2, "batch_size": 32, "lr": 1e-3, "precision": "auto", "max_steps": None,
            "register_as": None, "task": "reverse", "data_path": None, "lora_r": 8, "lora_alpha": 16,
            "lora_target_modules": ["q_proj"], "model_name": None, "cluster": None}
    plan = check_settings(good)
    assert plan.processes == 2
    cases = [({"epochs": 0}, "epochs=0: use a whole number"), ({"epochs": True}, "epochs=True"),
             ({"batch_size": 33}, "does not split evenly over 2 processes: use a multiple of 2, such as 32"),
             ({"lr": -1}, "lr=-1: use a positive"), ({"task": "copy"}, "task='copy': use one of 'reverse'"),
             ({"lora_r": 0}, "lora_r=0: a LoRA rank"), ({"lora_target_modules": "q_proj"}, "give a list"),
             ({"lora_target_modules": None}, "give a list"), ({"max_steps": 0}, "max_steps=0"),
             ({"precision": "fp8"}, "precision='fp8'"), ({"precision": "fp16"}, "needs a GPU"),
             ({"processes": 0}, "processes=0 must be at least 1")]
    for change, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            check_settings({**good, **change})
    assert check_settings({**good, "lora_target_modules": None}, lora_targets_none="every linear layer")
    assert check_settings({**good, "task": "copy", "data_path": "mine.jsonl"})   # the task is not used then


def test_the_small_checks(tmp_path):
    check_choice("strategy", "fsdp", ("ddp", "fsdp"))
    with pytest.raises(ValueError, match="strategy='zero': use one of 'ddp', 'fsdp'"):
        check_choice("strategy", "zero", ("ddp", "fsdp"))
    with pytest.raises(ValueError, match="flag=1: use one of True, False"):
        check_choice("flag", 1, (True, False))
    with pytest.raises(ValueError, match="steps=2.0"):
        check_whole("steps", 2.0)
    check_lora(8, 16, "all-linear")
    with pytest.raises(ValueError, match="lora_alpha=0"):
        check_lora(8, 0, ["q_proj"])
    check_local_checkpoint(None)
    check_local_checkpoint("org/hub-id")   # not a folder here: a hub id, for a machine that can download
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        check_local_checkpoint(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        check_local_checkpoint(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    check_local_checkpoint(str(tmp_path))


def test_the_step_harness_caps_counts_and_times():
    from helpers.step_harness import StepHarness

    steps = StepHarness(3, 10, max_steps=4)   # 3 epochs of 2 steps: the cap spread over the epochs
    seen = [[b for b in steps.batches(range(10))] for _ in range(steps.epochs)]
    assert seen == [[0, 1], [0, 1], [0, 1]] and steps.done == 6
    figures = steps.finish(samples_per_step=8, device="cpu")
    assert figures["steps_run"] == 6 and figures["samples_per_s"] > 0 and figures["peak_gpu_mb"] is None
    full = StepHarness(1, 5, None, start_step=2)
    assert list(full.steps()) == [2, 3, 4]


@pytest.mark.parametrize("on", [False, True], ids=["tracking off", "tracking on"])
def test_a_logged_model_loads_back_and_answers_the_same(on, tmp_path, monkeypatch):
    from helpers.registry import log_model

    monkeypatch.setenv(tracking.ENV_SWITCH, "on" if on else "off")
    monkeypatch.setenv(tracking.ENV_URI, tracking.sqlite_uri(tmp_path / "mlflow.db"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3)).eval()
    examples = np.random.default_rng(0).random((5, 4), dtype=np.float32)
    logged = log_model(model, "99_test", examples=examples, register_as="tiny" if on else None)
    assert (logged.run_id is not None) == on
    assert logged.uri == "models:/tiny/1" if on else logged.uri.endswith("model")
    with torch.no_grad():
        assert torch.equal(logged.load()(torch.from_numpy(examples)), model(torch.from_numpy(examples)))
