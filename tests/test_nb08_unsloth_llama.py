"""Notebook 08 under papermill with parameters other than the stored defaults.

The stored notebook (Unsloth, LoRA + full embeddings on the tiny Llama 3.2, 2 processes) is executed by
nbval, with its learning bar and reference run, and saves the merged model locally in MLflow's format. The
Llama-3.2-3B command runs in tests/test_scale_up.py, with the plain TRL + PEFT comparison that is on by
default only on GPUs. Here: the bad settings that must fail before any launch, and the registry path
(tracking on, register_as).
"""

import json
import subprocess
import sys
import textwrap

import pytest

from helpers import tracking

pytestmark = pytest.mark.notebook


def test_bad_settings_fail_before_launch(refusals, bad_sft_inputs):
    cases = {
        "lora_r=0: a LoRA rank is a whole number of 1 or more": {"lora_r": 0},
        "holds a model but no tokenizer": {"model_name": str(bad_sft_inputs.model_without_tokenizer)},
        "line 1 has no 'messages' field": {"dataset_path": str(bad_sft_inputs.alpaca_jsonl)},
        "lora_target_modules: ['qkv_proj'] match no module of this model; its linear layers are":
            {"lora_target_modules": ["q_proj", "qkv_proj"]},
        "lora_target_modules='q_proj': give a list of module names": {"lora_target_modules": "q_proj"},
        "load_in_4bit='yes': use one of 'auto', True, False": {"load_in_4bit": "yes"},
        "batch_size=30 does not split evenly over 4 processes": {"batch_size": 30, "processes": 4},
    }
    for message, refusal in zip(cases, refusals("08_unsloth_llama", *cases.values()), strict=True):
        assert message in refusal.error
        assert "[rank" not in refusal.output   # nothing was launched


# A fresh process: MLflow's transformers flavor and the registry, nothing of the notebook, Unsloth or PEFT. It
# generates greedily after the logged input example's prompts, as the notebook's exact_match does, for the
# longest answer of the built-in task (4 letters) + 2 tokens.
_LOAD_BY_NAME = textwrap.dedent("""
    import json, sys
    import mlflow, mlflow.transformers, torch
    from mlflow.models import Model

    mlflow.set_tracking_uri(sys.argv[1])
    local = mlflow.artifacts.download_artifacts(sys.argv[2])
    prompts = Model.load(local).load_input_example(local)
    prompts = list(prompts.iloc[:, 0]) if hasattr(prompts, "iloc") else list(prompts)
    parts = mlflow.transformers.load_model(local, return_type="components")
    model, tokenizer = parts["model"], parts["tokenizer"]
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    answers = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    print(json.dumps([a.strip() for a in answers]))
""")


def load_by_name(store: str, uri: str) -> list[str]:
    """The answers of the model registered at `uri`, loaded in a fresh process from the registry alone."""
    done = subprocess.run([sys.executable, "-c", _LOAD_BY_NAME, store, uri], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_registers_its_merged_model_and_a_fresh_process_loads_it_by_name(run_notebook, tmp_path, monkeypatch):
    """Tracking on (a SQLite store of this test's own) and register_as: the merged model is registered, and
    a fresh process loads it by name and gives the notebook's answers. 100 steps: enough to answer
    something."""
    store = tracking.sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv(tracking.ENV_SWITCH, "on")
    monkeypatch.setenv(tracking.ENV_URI, store)
    _, metrics = run_notebook("08_unsloth_llama", max_steps=100, n_test=8, register_as="tiny-llama-reverse")
    assert metrics["logged_model_uri"] == "models:/tiny-llama-reverse/1"
    answers = metrics["logged_model_answers"].split(" | ")
    assert len(answers) == 4 and any(answers), answers
    assert load_by_name(store, "models:/tiny-llama-reverse/1") == answers
