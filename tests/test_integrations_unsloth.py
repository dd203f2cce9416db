"""helpers.integrations.unsloth, notebook 08's machinery: what the kernel sets before Unsloth, the LoRA plan
and its target check, which functions ran each part of a model, the rank's record of its run, the plain
TRL + PEFT run and the timing comparison. Unsloth itself is not imported here (the notebook's runs import it);
each check is shown failing on the input it exists for."""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace

import pytest
import torch

from helpers.integrations import unsloth as gallery_unsloth


def _tiny_llama_config(vocab_size: int = 32):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True,
                       max_position_embeddings=64)


def test_before_unsloth_sets_the_environment_and_starts_the_forkserver(monkeypatch):
    import helpers.launch

    started = []
    monkeypatch.setattr(helpers.launch, "preload", lambda *modules: started.append(modules))
    for name in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS",
                 "HF_DATASETS_DISABLE_PROGRESS_BARS", "TOKENIZERS_PARALLELISM", "DS_ACCELERATOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")   # a user's own setting is kept
    gallery_unsloth.before_unsloth()
    assert started == [("unsloth", "trl.trainer.sft_trainer", "datasets")]
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error" and os.environ["DS_ACCELERATOR"] == "cpu"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_plan_lora_counts_what_peft_trains_and_refuses_a_target_that_matches_nothing(capsys):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    config = _tiny_llama_config()
    planned = gallery_unsloth.plan_lora(config, 4, 8, ["q_proj", "v_proj"], embeddings=True, four_bit=False)
    printed = capsys.readouterr().out
    assert "LoRA r=4 on ['q_proj', 'v_proj'] + embed_tokens, lm_head in full" in printed
    torch.manual_seed(0)
    real = get_peft_model(LlamaForCausalLM(config), LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
        modules_to_save=["embed_tokens", "lm_head"], ensure_weight_tying=True))
    assert planned.trainable == real.get_nb_trainable_parameters()[0]
    lora_only = gallery_unsloth.plan_lora(config, 4, 8, ["q_proj", "v_proj"], embeddings=False,
                                          four_bit=False)
    assert lora_only.trainable < planned.trainable   # the embeddings' full matrices are what the plan adds
    with pytest.raises(ValueError, match=r"\['qkv_proj'\] match no module of this model; its linear layers "
                                         r"are \['down_proj', 'gate_proj', 'k_proj', 'lm_head'"):
        gallery_unsloth.plan_lora(config, 4, 8, ["q_proj", "qkv_proj"], embeddings=False, four_bit=False)


def test_the_plain_model_trains_the_adapters_the_plan_counts(tmp_path, capsys):
    from transformers import LlamaForCausalLM

    from helpers.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = _tiny_llama_config(len(tokenizer))
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    cfg = {"model_path": str(tmp_path), "four_bit": False, "gradient_checkpointing": "unsloth", "lora_r": 4,
           "lora_alpha": 8, "lora_target_modules": ["q_proj", "o_proj"], "embeddings": True, "seed": 0}
    model, loaded_tokenizer = gallery_unsloth.plain_peft_model(cfg, torch.float32, "cpu")
    planned = gallery_unsloth.plan_lora(config, 4, 8, ["q_proj", "o_proj"], embeddings=True, four_bit=False)
    assert model.get_nb_trainable_parameters()[0] == planned.trainable
    assert loaded_tokenizer.pad_token is not None and model.is_gradient_checkpointing


def test_implementations_follow_wrappers_to_the_model_code_and_the_table_says_whose_they_are(capsys):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(_tiny_llama_config())
    mlp = model.model.layers[0].mlp
    original = type(mlp).forward

    @functools.wraps(original)   # a decorator that copies the wrapped function's name cannot hide it
    def wrapped(self, x):
        return original(self, x)

    mlp.forward = wrapped.__get__(mlp)
    found = gallery_unsloth.implementations(model)
    # outside site-packages a function is named by its file's stem
    assert found["MLP"] == ["test_integrations_unsloth.test_implementations_follow_wrappers_to_the_model_"
                            "code_and_the_table_says_whose_they_are.wrapped",
                            "transformers.models.llama.modeling_llama.LlamaMLP.forward"]
    assert found["attention"][-1] == "transformers.models.llama.modeling_llama.LlamaAttention.forward"
    table = gallery_unsloth.show_speedups(found)
    assert not table["from Unsloth"].any()
    assert "LlamaMLP.forward" in capsys.readouterr().out   # printed whole, not cut at pandas' column width
    found["attention"] = ["unsloth.models.llama.LlamaAttention_fast_forward", *found["attention"]]
    assert gallery_unsloth.show_speedups(found).loc["attention", "from Unsloth"]


def test_measured_records_the_run_a_rank_returns(tmp_path, capsys):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM, Trainer, TrainingArguments

    from helpers.integrations.transformers import with_step_losses

    torch.manual_seed(0)
    model = get_peft_model(LlamaForCausalLM(_tiny_llama_config()),
                           LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    ids = torch.randint(0, 32, (16, 8))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=3,
                             use_cpu=True, report_to="none", disable_tqdm=True, save_strategy="no",
                             logging_steps=1)
    trainer = with_step_losses(Trainer)(model=model, args=args, train_dataset=data)
    ctx = SimpleNamespace(device="cpu", is_main=True)
    with gallery_unsloth.measured(trainer, ctx, "plain TRL + PEFT") as record:
        assert record == {}   # filled once training is done
        trainer.train()
    assert len(record["step_losses"]) == len(record["step_ends"]) == 3
    assert record["step_ends"] == sorted(record["step_ends"])
    assert record["train_seconds"] >= record["step_ends"][-1]
    assert record["trainable"] == record["peft_trainable"] == model.get_nb_trainable_parameters()[0]
    assert len(record["fingerprint"]) == 64 and record["four_bit"] is False and record["cuda_peak_mb"] is None
    assert record["implementations"]["MLP"][-1].endswith("LlamaMLP.forward")
    out = capsys.readouterr().out
    assert "plain TRL + PEFT: 3 steps in" in out and "{'loss'" not in out   # no PrinterCallback lines
    # the fingerprint is of the trained weights: another step changes it
    before = record["fingerprint"]
    trainer.args.max_steps = 4
    with gallery_unsloth.measured(trainer, SimpleNamespace(device="cpu", is_main=False), "again") as again:
        trainer.train()
    assert again["fingerprint"] != before and "again:" not in capsys.readouterr().out   # rank 0 prints only


def test_epoch_means_split_the_steps_even_when_a_capped_run_stops_inside_an_epoch():
    import pandas as pd

    losses = pd.Series([4.0, 2.0, 1.0, 1.0, 0.5, 0.5], index=range(1, 7))   # steps counted from 1
    assert gallery_unsloth.epoch_means(losses, 3) == [{"epoch": 1, "train_loss": 3.0},
                                                      {"epoch": 2, "train_loss": 1.0},
                                                      {"epoch": 3, "train_loss": 0.5}]
    assert [h["epoch"] for h in gallery_unsloth.epoch_means(losses[:2], 3)] == [1, 2]   # 2 steps, 3 epochs


def test_the_comparison_launches_plain_in_fresh_processes_and_rates_the_steady_steps(capsys):
    launches = []

    class Launchable:
        def __init__(self, options=None):
            self.opts = options or {}

        def options(self, **changes):
            return Launchable({**self.opts, **changes})

        def distributed(self, cfg, steps, backend):
            launches.append((self.opts, cfg["output_dir"], steps, backend))
            ends = [0.5, 1.0, 2.0, 3.0, 4.0] if backend == "unsloth" else [1.0, 2.0, 4.0, 6.0, 8.0]
            return [{"step_ends": ends, "step_losses": [3.0, 2.0, 1.0, 0.5, 0.4], "cuda_peak_mb": None}] * 2

    timed = gallery_unsloth.time_against_plain(Launchable(), {"output_dir": "/out"}, 5, None)
    assert launches == [({"start_method": "spawn"}, None, 5, "plain"), ({}, None, 5, "unsloth")]
    gallery_unsloth.time_against_plain(Launchable(), {"output_dir": "/out"}, 5, "ray://head:10001")
    assert launches[2][0] == {}   # on a Ray cluster every launch's workers are fresh processes already
    assert gallery_unsloth.steady_rate(timed["plain"][0], 8) == pytest.approx(3 * 8 / 6.0)
    table, speedup = gallery_unsloth.comparison_table(timed, 8)
    assert speedup == pytest.approx(2.0) and table.loc["plain", "step losses (first 3)"] == [3.0, 2.0, 1.0]
    assert gallery_unsloth.show_comparison(timed, 8) == pytest.approx(2.0)
    printed = capsys.readouterr().out
    assert "Unsloth ran 2.00x the samples per second of plain TRL + PEFT, over 5 steps" in printed
    assert gallery_unsloth.show_comparison({}, 8) is None
    assert "compare_plain is off here" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs more than 2 steps"):
        gallery_unsloth.steady_rate({"step_ends": [1.0, 2.0]}, 8)
