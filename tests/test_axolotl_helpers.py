"""Notebook 09's helpers, each check shown failing on the input it exists for: the kernel's side of Axolotl
(its environment, the YAML's paths, the LoRA targets, a user's chat file, the Ray workers' records), the
adapter evaluation and its reload batches, the OLMo 3 7B tables, and the plugin's CPU workarounds (in
Axolotl's own environment, where it is found)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.integrations import axolotl_launch
from helpers.integrations.axolotl_launch import (
    check_lora_targets,
    find_interpreter,
    for_ranks,
    hold_out,
    rank_settings,
    read_records,
    versions_of,
)
from helpers.paths import ROOT

AXOLOTL_PYTHON = ROOT / ".venv-axolotl" / "bin" / "python"


def _tiny_olmo3(folder: Path, seed: int = 0):
    """A 2-layer OLMo 3 of width 32 and the gallery's character tokenizer, saved as a checkpoint."""
    from transformers import Olmo3Config, Olmo3ForCausalLM

    from helpers.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Olmo3Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, sliding_window=8,
                         layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    Olmo3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return config


def _rows(n: int) -> list[dict]:
    import random

    from helpers.data.sft_tasks import make_example

    rng = random.Random(0)
    return [make_example("reverse", rng, 3, 4) for _ in range(n)]


def test_axolotls_interpreter_is_found_or_the_fix_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="Axolotl's environment is not built .* `make venv-axolotl`"):
        find_interpreter(str(tmp_path / "no-venv" / "python"))
    assert Path(find_interpreter("python3")).is_file()   # a command on PATH is found there
    assert versions_of(sys.executable, ("torch",)) == {"torch": importlib.metadata.version("torch")}
    with pytest.raises(RuntimeError, match="cannot report Axolotl's version.*PackageNotFoundError"):
        versions_of(sys.executable, ("no-such-package-here",))


def test_what_the_ranks_inherit():
    hub = rank_settings("allenai/Olmo-3-7B-Instruct", cuda=True)
    assert hub["AXOLOTL_DO_NOT_TRACK"] == "1" and "HF_HUB_OFFLINE" not in hub and "DS_ACCELERATOR" not in hub
    local = rank_settings(None, cuda=False)   # the built-in model is a local folder; no GPU
    assert local["HF_HUB_OFFLINE"] == "1" and local["DS_ACCELERATOR"] == "cpu"
    assert rank_settings(str(ROOT), cuda=True)["HF_HUB_OFFLINE"] == "1"
    assert set(axolotl_launch.CONDITIONAL_SETTINGS) == {"HF_HUB_OFFLINE", "DS_ACCELERATOR"}


@pytest.mark.skipif(not AXOLOTL_PYTHON.is_file(), reason="Axolotl's environment is not built")
def test_the_environment_compares_versions_and_sets_the_ranks_settings(monkeypatch):
    for name in (*axolotl_launch.RANK_SETTINGS, *axolotl_launch.CONDITIONAL_SETTINGS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOG_LEVEL", "WARNING")   # what the user set stays
    env = axolotl_launch.axolotl_environment(None, model_name=None)
    assert env.python == str(AXOLOTL_PYTHON)
    assert env.versions.loc["axolotl"].tolist() == [axolotl_launch.AXOLOTL_VERSION, "-"]
    assert env.versions.loc["torch"].nunique() == 1   # the same torch on both sides
    assert os.environ["AXOLOTL_DO_NOT_TRACK"] == "1" and os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["LOG_LEVEL"] == "WARNING"


def test_yaml_paths_are_relative_on_one_machine_and_absolute_on_a_cluster(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    assert for_ranks(tmp_path / "data" / "train.jsonl") == os.path.join("data", "train.jsonl")
    # to be written: its folder exists
    assert for_ranks(tmp_path / "data" / "out") == os.path.join("data", "out")
    assert for_ranks("data/train.jsonl", cluster="auto") == str(tmp_path / "data" / "train.jsonl")
    assert for_ranks("allenai/Olmo-3-7B-Instruct") == "allenai/Olmo-3-7B-Instruct"   # a hub id


def test_lora_targets_must_name_modules_of_the_model(tmp_path):
    config = _tiny_olmo3(tmp_path)
    check_lora_targets(config, None)
    check_lora_targets(config, ["q_proj", "down_proj"])
    with pytest.raises(ValueError, match=r"\['qkv_proj'\] match no module of this model; its linear layers "
                                         r"are \['down_proj', 'gate_proj', 'k_proj', 'lm_head', 'o_proj'"):
        check_lora_targets(config, ["q_proj", "qkv_proj"])


def test_a_users_chat_file_is_checked_and_split(tmp_path):
    rows = _rows(10)
    source = tmp_path / "mine.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train_path, train_rows, test_rows = hold_out(source, 3, seed=1, folder=tmp_path / "out")
    assert (len(train_rows), len(test_rows)) == (7, 3)
    assert [json.loads(line) for line in train_path.read_text().splitlines()] == train_rows
    assert sorted(map(json.dumps, train_rows + test_rows)) == sorted(map(json.dumps, rows))
    assert hold_out(source, 3, seed=1, folder=tmp_path / "again")[2] == test_rows   # seeded
    with pytest.raises(ValueError, match="has 10 conversations: it needs more than n_test=10"):
        hold_out(source, 10, seed=1, folder=tmp_path / "out")
    source.write_text('{"instruction": "reverse: abc", "output": "cba"}\n')
    with pytest.raises(ValueError, match="line 1 has no 'messages' field"):
        hold_out(source, 1, seed=1, folder=tmp_path / "out")


def test_the_ray_workers_records_come_back_in_rank_order(tmp_path):
    for rank in (10, 2, 0, 1):
        (tmp_path / f"gallery-record-rank{rank}.json").write_text(json.dumps({"rank": rank}))
    assert [r["rank"] for r in read_records(tmp_path, 4)] == [0, 1, 2, 10]
    assert not list(tmp_path.glob("gallery-record-*"))   # read once
    (tmp_path / "gallery-record-rank0.json").write_text("{}")
    with pytest.raises(RuntimeError, match="1 of the 2 Ray workers left their record"):
        read_records(tmp_path, 2)


def test_the_adapter_is_scored_merged_and_answered_again_in_the_ranks_batches(tmp_path):
    """evaluate_checkpoint as rank 0 of 1 (the launcher's in-process call): the base model, then an adapter
    on top, merged; the merged checkpoint answers as the evaluation did, in the ranks' batches at any world
    size."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers import distributed
    from helpers.integrations.adapter_eval import answers_in_rank_batches, evaluate_checkpoint
    from helpers.integrations.sft_eval import answer_budget, greedy_answers, prompt_texts

    base = tmp_path / "base"
    _tiny_olmo3(base)
    rows = _rows(5)
    evaluate = distributed(evaluate_checkpoint, processes=1, device="cpu")
    before = evaluate(str(base), rows)
    assert set(before) == {"accuracy", "answers", "loss", "dtype"} and before["dtype"] == "float32"
    torch.manual_seed(1)   # an adapter that changes the answers: B not zero, embeddings trained in full
    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                          LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False,
                                     modules_to_save=["embed_tokens", "lm_head"]))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "modules_to_save" in name:
                p.add_(torch.randn_like(p))
    lora.save_pretrained(tmp_path / "adapter")
    AutoTokenizer.from_pretrained(base).save_pretrained(tmp_path / "adapter")
    after = evaluate(str(base), rows, adapter=str(tmp_path / "adapter"), merged_dir=str(tmp_path / "merged"))
    assert after["loss"] != before["loss"] and after["answers"] != before["answers"]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert answers_in_rank_batches(merged, tokenizer, rows, world=1) == after["answers"]
    # at 2 ranks: each share in turn, the shorter one padded with the first row, as rank_share pads it
    shares = [rows[0::2], rows[1::2] + [rows[0]]]
    budget = answer_budget(tokenizer, rows)
    by_share = [greedy_answers(merged, tokenizer, prompt_texts(tokenizer, s), budget) for s in shares]
    assert answers_in_rank_batches(merged, tokenizer, rows, world=2) == [
        by_share[0][0], by_share[1][0], by_share[0][1], by_share[1][1], by_share[0][2]]
    base_model = AutoModelForCausalLM.from_pretrained(base)   # an untrained model does not answer the same
    assert answers_in_rank_batches(base_model, tokenizer, rows, world=1) != after["answers"]


def test_what_olmo_3_7b_needs_under_ddp():
    from helpers.integrations.axolotl_scale import lora_for, olmo3_7b_under_ddp
    from helpers.memory_plan import ParamCounts

    assert lora_for(8, 16, None).target_modules == "all-linear"
    assert lora_for(8, 16, ["q_proj"]).target_modules == {"q_proj"}
    mine = ParamCounts("this model", total=1000, trainable=100)
    scale = olmo3_7b_under_ddp(mine, lora_r=16, lora_alpha=16, lora_target_modules=None, world_size=2)
    assert list(scale.per_gpu.index) == ["this model, as trained here", "OLMo 3 7B, bf16 LoRA",
                                         "OLMo 3 7B, 4-bit QLoRA", "OLMo 3 7B, full fine-tuning"]
    total = scale.per_gpu["total (MB)"]
    assert (total["OLMo 3 7B, 4-bit QLoRA"] < total["OLMo 3 7B, bf16 LoRA"]
            < total["OLMo 3 7B, full fine-tuning"])
    assert scale.verdicts[0].startswith("OLMo 3 7B, 4-bit QLoRA on 24 GB GPUs: DDP")
    assert "FSDP" in scale.verdicts[1]
    assert scale.placement.loc["this kernel", "model state (GB)"] == 0.0
    # 7.3e9 weights in bf16
    assert scale.placement["model state (GB)"].max() == pytest.approx(14.6, abs=0.05)


def test_olmo_3_configs_side_by_side(tmp_path):
    from helpers.models.olmo3 import beside_olmo3_7b, parameter_count

    config = _tiny_olmo3(tmp_path)
    table = beside_olmo3_7b(config)
    assert list(table.columns) == ["this model", "OLMo 3 7B"]
    assert table.loc["full-attention layers"].tolist() == [1, 8]
    assert table.loc["parameters", "this model"] == f"{parameter_count(config):,}"


PLUGIN_ON_CPU = """
import os
from axolotl.utils.dict import DictDefault
import axolotl.utils.trainer
from helpers.integrations.axolotl import GalleryPlugin

plugin, cfg = GalleryPlugin(), DictDefault(device_map={"": 0}, device="cpu")
plugin.register(cfg)
assert axolotl.utils.trainer.check_cuda_p2p_ib_support(), "the peer-access check still asks CUDA"
assert plugin.load_datasets(cfg, preprocess=False) is None, "the plugin loaded datasets itself"
assert cfg.device_map == {"": "cpu"}, cfg.device_map
print("ok")
"""


@pytest.mark.skipif(not AXOLOTL_PYTHON.is_file(), reason="Axolotl's environment is not built")
def test_the_plugin_lets_axolotl_run_on_cpu_ranks():
    """In Axolotl's environment, without a GPU: the two GPU assumptions of Axolotl 0.13.2 answered."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT), AXOLOTL_DO_NOT_TRACK="1",
               WORLD_SIZE="2", LOCAL_RANK="0")
    done = subprocess.run([str(AXOLOTL_PYTHON), "-c", PLUGIN_ON_CPU], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
