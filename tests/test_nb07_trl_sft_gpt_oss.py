"""Notebook 07 under papermill with parameters other than the stored defaults.

The stored notebook (FSDP, full fine-tuning, 2 processes, with the DDP-vs-FSDP parity runs) is executed by
nbval, with its learning bar and reference run. This file runs the other kind of training, FSDP with LoRA, on
a two-node Ray cluster (one rank per node), for a few steps (`max_steps`): the LoRA checks (a gradient in
every adapter matrix, moved expert adapters) and the adapter's save / reload / evaluation hold at any size.
The 120B-shaped FSDP + LoRA command runs in tests/test_scale_up.py, on an MXFP4 stand-in. The fine-tuned model
is logged to MLflow and registered with `register_as` (tracking on, a SQLite store of the test's own): a fresh
process loads it by name from the registry alone, with MLflow's pyfunc loader, and answers the logged input
example as the notebook did. And the bad settings that must fail before any launch.
"""

import json
import re
import subprocess
import sys
import textwrap

import pytest

from tests.support import stream_text

pytestmark = pytest.mark.notebook


def test_fsdp_lora_on_two_nodes(run_notebook, two_node_cluster):
    """FSDP2 + LoRA with one rank on each node of a two-node Ray cluster."""
    nb, metrics = run_notebook("07_trl_sft_gpt_oss", strategy="fsdp", peft="lora", processes=2, n_train=400,
                               n_test=16, max_steps=6, run_parity=False, cluster=two_node_cluster.address)
    assert metrics["strategy"] == "fsdp" and metrics["peft"] == "lora" and metrics["processes"] == 2
    assert metrics["nodes"] == 2
    out = stream_text(nb)
    assert "2 ranks ran on 2 node(s)" in out
    assert "FSDP fine-tuning: 6 steps" in out
    assert "adapter matrices received a gradient; the 8 expert adapter matrices changed" in out
    assert re.search(r"rank 0 wrote to output_dir: \[.*'adapter_model.safetensors'", out)
    assert "the loaded model answers all 16 held-out prompts as the evaluation did" in out


# A third process: MLflow's pyfunc loader and the registry, nothing of the notebook or of helpers
_LOAD_BY_NAME = textwrap.dedent("""
    import json, sys
    import mlflow

    mlflow.set_tracking_uri(sys.argv[1])
    model = mlflow.pyfunc.load_model(sys.argv[2])
    print(json.dumps([str(a).strip() for a in model.predict(model.input_example)]))
""")


def test_registers_its_model_and_a_fresh_process_loads_it_by_name(run_notebook, registry):
    nb, metrics = run_notebook("07_trl_sft_gpt_oss", strategy="ddp", processes=1, n_test=16, max_steps=6,
                               run_parity=False, register_as="tiny-gpt-oss-sft")
    assert metrics["logged_model_uri"] == "models:/tiny-gpt-oss-sft/1"
    assert "logged to MLflow run" in stream_text(nb)
    done = subprocess.run([sys.executable, "-c", _LOAD_BY_NAME, registry, metrics["logged_model_uri"]],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == json.loads(metrics["logged_model_answers"])


def test_bad_settings_fail_before_launch(refusals, tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    cases = {
        "strategy='zero3': use one of 'ddp', 'fsdp'": {"strategy": "zero3"},
        "'mlp.experts.up_proj' matches no parameter": {"lora_target_parameters": ["mlp.experts.up_proj"]},
        "lora_target_modules=['qkv_proj'] matches nothing": {"lora_target_modules": ["qkv_proj"]},
        "holds a model but no tokenizer": {"model_name": str(tmp_path / "model")},
        "give the name to register the model under": {"register_as": "a/b"},
    }
    for message, refusal in zip(cases, refusals("07_trl_sft_gpt_oss", *cases.values()), strict=True):
        assert message in refusal.error
        assert "[rank" not in refusal.output   # nothing was launched


def test_chat_data_with_a_pretrained_looking_model(run_notebook):
    """07 on the shipped natural-language chat JSONL (tests/data), FSDP on 2 processes, with a warmed-up
    tiny GPT-OSS whose tokenizer is a plain PreTrainedTokenizerFast (it returns token_type_ids): the notebook
    passes on held-out loss and training loss, where the built-in task's 4x fall would have failed it."""
    from tests.data.chat_facts import JSONL, pretrained_looking

    nb, metrics = run_notebook("07_trl_sft_gpt_oss", model_name=str(pretrained_looking("gpt-oss")),
                               data_path=str(JSONL), processes=2, n_test=16, batch_size=8, epochs=3,
                               lr=1e-3, max_length=256, run_parity=False)
    out = stream_text(nb)
    assert "your model or data: the training loss and the held-out loss fell" in out
    # evaluated in the ranks; the kernel loaded no model, and the streamed save is a from_pretrained folder
    assert metrics["kernel_loaded_model"] is False and "this kernel loads no model" in out
    assert "'model-00001.safetensors'" in out and "'model.safetensors.index.json'" in out
    assert metrics["heldout_loss_after"] < metrics["heldout_loss_before"]
    fell = metrics["first_epoch_train_loss"] / metrics["last_epoch_train_loss"]
    assert fell < 4, f"the loss fell {fell:.1f}x: the old 4x demand would hold, the test shows nothing"
