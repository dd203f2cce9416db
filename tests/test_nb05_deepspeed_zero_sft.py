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
    assert abs(metrics["loaded_share_max"] - 0.5) < 0.05   # zero.Init: each rank loaded half, across nodes


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


# Your own data and model (issue 38, items 3 and 5): the checks that hold on real data, any tokenizer

def test_chat_data_with_a_pretrained_looking_model(run_notebook):
    """05 on the shipped natural-language chat JSONL, with a warmed-up tiny Llama whose tokenizer is a plain
    PreTrainedTokenizerFast (it returns token_type_ids, which generate refuses unless the notebook drops
    them): the notebook passes on held-out loss and training loss, where the built-in task's 4x fall and
    exact-match gain would have failed it."""
    from tests.data.chat_facts import JSONL, pretrained_looking

    nb, metrics = run_notebook("05_deepspeed_zero_sft", model_name=str(pretrained_looking("llama")),
                               data_path=str(JSONL), processes=2, n_test=16, batch_size=8, epochs=3,
                               lr=1e-3, max_length=256, run_parity=False)
    out = stream_text(nb)
    assert "your model or data: the training loss and the held-out loss fell" in out
    assert metrics["heldout_loss_after"] < metrics["heldout_loss_before"]
    # the rule: with model_name given the kernel loads no model (the evaluation ran in the ranks), and under
    # ZeRO-3 each of the 2 ranks loaded only its half of the parameters (zero.Init)
    assert metrics["kernel_loaded_model"] is False
    assert "the reload comparison runs for the built-in model only" in out
    assert abs(metrics["loaded_share_max"] - 0.5) < 0.05
    fell = metrics["first_epoch_train_loss"] / metrics["last_epoch_train_loss"]
    assert fell < 4, f"the loss fell {fell:.1f}x: the old 4x demand would hold, the test shows nothing"


def test_generation_inputs_drop_what_the_model_does_not_take():
    """A plain PreTrainedTokenizerFast returns token_type_ids; generate refuses them for a Llama, and
    generation_inputs passes only what its forward takes (through a PEFT wrapper too)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from helpers.integrations.transformers import generation_inputs
    from tests.data.chat_facts import plain_tokenizer

    tokenizer = plain_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    enc = tokenizer(["<|user|>hello<|assistant|>"], return_tensors="pt", add_special_tokens=False)
    assert "token_type_ids" in enc
    with pytest.raises(ValueError, match="token_type_ids"):
        model.generate(**enc, max_new_tokens=2, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    for m in (model, get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))):
        kept = generation_inputs(m, enc)
        assert set(kept) == {"input_ids", "attention_mask"}
        m.generate(**kept, max_new_tokens=2, do_sample=False, pad_token_id=tokenizer.pad_token_id)


def test_the_learning_checks_on_real_data_and_on_the_built_in_task():
    """check_learning, the Checks cells' learning checks: a pretrained model on chat data (loss 1.5x lower, no
    exact match at all) passes as your data and fails the built-in task's bars; a run whose held-out loss rose
    fails either way; a built-in run that learned the task passes."""
    from helpers.data.sft_tasks import check_learning

    chat = dict(step_losses=[1.5] * 8 + [1.0] * 8, heldout_before=1.4, heldout_after=1.2, accuracy_before=0.0,
                accuracy_after=0.0)
    assert "your model or data" in check_learning(**chat, built_in=False)
    with pytest.raises(AssertionError, match="training loss did not fall 4x"):
        check_learning(**chat, built_in=True)
    with pytest.raises(AssertionError, match="fine-tuning did not improve held-out accuracy"):
        check_learning(**dict(chat, step_losses=[4.0] * 8 + [0.5] * 8), built_in=True, bar=None)
    with pytest.raises(AssertionError, match="the held-out loss did not fall"):
        check_learning(**dict(chat, heldout_after=1.5), built_in=False)
    with pytest.raises(AssertionError, match="training loss did not fall"):
        check_learning(**dict(chat, step_losses=[1.0] * 16), built_in=False)
    learned = dict(step_losses=[4.0] * 30 + [0.1] * 30, heldout_before=4.0, heldout_after=0.2,
                   accuracy_before=0.0, accuracy_after=0.95)
    assert "bars held" in check_learning(**learned, built_in=True)
    with pytest.raises(AssertionError, match="below the bar 0.8"):
        check_learning(**dict(learned, accuracy_after=0.5), built_in=True)
