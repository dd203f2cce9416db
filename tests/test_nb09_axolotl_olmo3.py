"""Notebook 09 under papermill with parameters other than the stored defaults.

The stored notebook (Axolotl's do_train on 2 ranks in its own environment, LoRA + full embeddings on the
tiny OLMo 3, evaluated before and after in ranks of the gallery's environment, the adapter loaded there with
PEFT) is executed by nbval, with its learning bar and reference run, and saves the merged model locally in
MLflow's format. The OLMo-3-7B command runs in tests/test_scale_up.py. Here: the bad settings that must fail
before any launch, and before the YAML is written (a Ray cluster without GPUs among them), the registry path
(tracking on, register_as), and a user's own model and chat data (the kernel loads no model then).
"""

import pytest

from tests.support import stream_text, text_answers_by_name

pytestmark = pytest.mark.notebook


def test_bad_settings_fail_before_launch(refusals, bad_sft_inputs, tmp_path, two_node_cluster):
    """Among them, `cluster` naming a Ray cluster without GPUs (the two 1-CPU nodes): Axolotl 0.13.2's Ray
    path asks every worker for a GPU and would wait forever for it, so the settings check refuses, naming
    the fix."""
    cases = {
        "lora_r=0: a LoRA rank is a whole number of 1 or more": {"lora_r": 0},
        "holds a model but no tokenizer": {"model_name": str(bad_sft_inputs.model_without_tokenizer)},
        "line 1 has no 'messages' field": {"data_path": str(bad_sft_inputs.alpaca_jsonl)},
        "lora_target_modules: ['qkv_proj'] match no module of this model; its linear layers are":
            {"lora_target_modules": ["q_proj", "qkv_proj"]},
        "lora_target_modules='q_proj': give a list of module names": {"lora_target_modules": "q_proj"},
        "load_in_4bit='yes': use one of 'auto', True, False": {"load_in_4bit": "yes"},
        "batch_size=30 does not split evenly over 4 processes": {"batch_size": 30, "processes": 4},
        "Axolotl's environment is not built": {"axolotl_python": str(tmp_path / "no-venv" / "python")},
        "this Ray cluster has no GPU. With `cluster` set, this notebook trains with Axolotl's own Ray path":
            {"cluster": two_node_cluster.address},
    }
    for message, refusal in zip(cases, refusals("09_axolotl_olmo3", *cases.values()), strict=True):
        assert message in refusal.error
        assert "[rank" not in refusal.output   # nothing was launched
    assert not (bad_sft_inputs.model_without_tokenizer / "olmo3-lora.yml").exists()
    fix = "Run with cluster=None (this machine's CPUs or GPUs), or on a Ray cluster with GPUs"
    assert fix in refusal.error   # the last case: the cluster without GPUs


def test_chat_data_with_a_pretrained_looking_model(run_notebook, registry):
    """09 on the shipped natural-language chat JSONL (tests/data) with a warmed-up tiny Llama whose tokenizer
    is a plain PreTrainedTokenizerFast (it returns token_type_ids): the evaluation runs in the ranks, the
    checks are the held-out and training losses, and with model_name the kernel loads no model: the merged
    model is logged by path (the reload comparison is left out), registered (tracking on, a SQLite store of
    this test's own), and a fresh process (no Axolotl, no PEFT) loads it by name. (The built-in model's
    reload comparison runs in nbval's run of the stored notebook.)"""
    from tests.data.chat_facts import JSONL, pretrained_looking

    nb, metrics = run_notebook("09_axolotl_olmo3", model_name=str(pretrained_looking("llama")),
                               data_path=str(JSONL), n_test=16, batch_size=8, epochs=3, lr=1e-3,
                               max_length=256, register_as="tiny-olmo3-chat-facts")
    text = stream_text(nb)
    assert "your model or data: the training loss and the held-out loss fell" in text
    assert "the reload comparison runs for the built-in model only" in text
    assert metrics["heldout_loss_after"] < metrics["heldout_loss_before"]
    assert metrics["logged_model_uri"] == "models:/tiny-olmo3-chat-facts/1"
    answers = text_answers_by_name(registry, "models:/tiny-olmo3-chat-facts/1")
    assert len(answers) == 4 and all(isinstance(a, str) for a in answers), answers
