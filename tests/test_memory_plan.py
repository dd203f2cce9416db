"""helpers.memory_plan: the counts of the published models, the arithmetic by hand, against DeepSpeed's own
estimators, bitsandbytes' NF4 storage, peft's trainable count and what FSDP2 really allocates per rank; all
through `helpers.memory_plan`, which re-exports helpers.param_counts, published_models and technique_plan
(tests/test_reexports.py holds it to that)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import memory_plan as mp
from helpers.memory_plan import (
    NF4_BYTES,
    TECHNIQUES,
    ParamCounts,
    count_parameters,
    count_real_model,
    model_state_bytes,
    real_config,
    technique_table,
    which_technique,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The sizes the model cards state (Llama 3.2 1B and 3B, OLMo 3 7B, gpt-oss-20b and -120b)
PUBLISHED = {"llama-3.2-1b": 1.24e9, "llama-3.2-3b": 3.21e9, "olmo-3-7b": 7.3e9, "gpt-oss-20b": 21e9,
             "gpt-oss-120b": 117e9}


@pytest.mark.parametrize("name", PUBLISHED)
def test_real_models_have_their_published_size(name):
    counts = count_real_model(name)
    assert counts.total == pytest.approx(PUBLISHED[name], rel=0.03), f"{name}: {counts.total:,} parameters"
    assert counts.trainable == counts.total and counts.mode == "full"


def test_every_real_model_is_checked():
    assert set(PUBLISHED) == set(mp.REAL_MODELS)


def test_quantizable_weights_are_the_linear_layers_but_the_head():
    """Llama 3.2 1B: all but the (tied) embedding and the RMSNorm weights are linear layers' weights."""
    config = real_config("llama-3.2-1b")
    counts = count_real_model("llama-3.2-1b")
    norms = (2 * config.num_hidden_layers + 1) * config.hidden_size
    assert counts.quantizable == counts.total - config.vocab_size * config.hidden_size - norms
    outside = config.vocab_size * config.hidden_size + config.hidden_size   # embedding, final norm
    per_layer = (counts.total - outside) // config.num_hidden_layers
    assert counts.largest_block == per_layer
    assert counts.outside_blocks == outside


# ---- the arithmetic, by hand ------------------------------------------------------------------------------

FULL = ParamCounts("hand", total=1000, trainable=1000, largest_block=100, outside_blocks=200)


def hand_full_n4() -> dict[str, tuple[float, float]]:
    """(GPU bytes, CPU bytes) of a 1,000-parameter model on 4 GPUs, mixed precision, AdamW.

    PyTorch (DDP, FSDP): fp32 parameter 4 + gradient 4 + two moments 8 = 16 B. DeepSpeed: bf16 parameter 2 +
    gradient 2 + fp32 master 4 + moments 8 = 16 B. The gathered unit: (100 + 200) parameters x 2 B = 600."""
    return {"ddp": (16 * 1000, 0), "fsdp": (16 * 1000 / 4 + 600, 0),
            "zero1": (2000 + 2000 + 12000 / 4, 0), "zero2": (2000 + 2000 / 4 + 12000 / 4, 0),
            "zero3": (16000 / 4 + 600, 0), "zero2_offload": (2000, 16000 / 4),
            "zero3_offload": (2000 / 4 + 600, 16000 / 4)}


@pytest.mark.parametrize("technique", TECHNIQUES)
def test_full_fine_tuning_arithmetic_by_hand(technique):
    estimate = model_state_bytes(FULL, technique, world_size=4)
    assert (estimate.total, estimate.cpu) == pytest.approx(hand_full_n4()[technique])


def test_the_hand_check_fails_on_a_wrong_byte_count(monkeypatch):
    """Adam's moments counted at 4 B (one moment) instead of 8: the hand figures no longer match."""
    monkeypatch.setitem(mp.OPTIMIZER_STATE_BYTES, "adamw", 4)
    wrong = [t for t in TECHNIQUES
             if (model_state_bytes(FULL, t, 4).total, model_state_bytes(FULL, t, 4).cpu)
             != pytest.approx(hand_full_n4()[t])]
    assert wrong == list(TECHNIQUES)


def test_sgd_keeps_one_moment():
    assert model_state_bytes(FULL, "ddp", 1, optimizer="sgd").total == (4 + 4 + 4) * 1000


def test_lora_and_qlora_arithmetic_by_hand():
    """10 trainable of 1,000; 800 of the 990 frozen are linear weights: bf16, or NF4 under QLoRA."""
    lora = ParamCounts("hand", total=1000, trainable=10, quantizable=800, largest_block=100,
                       largest_block_quantizable=80, outside_blocks=200)
    qlora = ParamCounts("hand", total=1000, trainable=10, quantizable=800, largest_block=100,
                        largest_block_quantizable=80, outside_blocks=200, load_in_4bit=True)
    assert (lora.mode, qlora.mode) == ("lora", "qlora")
    assert model_state_bytes(lora, "ddp", 4).total == 2 * 990 + 16 * 10
    frozen_4bit = 2 * 190 + NF4_BYTES * 800
    assert model_state_bytes(qlora, "ddp", 4).total == pytest.approx(frozen_4bit + 16 * 10)
    gathered_4bit = 2 * 20 + NF4_BYTES * 80 + 2 * 200
    expected = (frozen_4bit + 16 * 10) / 4 + gathered_4bit
    assert model_state_bytes(qlora, "fsdp", 4).total == pytest.approx(expected)
    assert model_state_bytes(lora, "zero1", 4).total == 2 * 990 + 2 * 10 + 2 * 10 + 12 * 10 / 4


@pytest.mark.parametrize("name", ["llama-3.2-1b", "gpt-oss-20b"])
@pytest.mark.parametrize("mode", ["full", "lora", "qlora"])
def test_zero_stages_hold_less_and_less(name, mode):
    counts = count_real_model(name, mode)
    for n in (1, 2, 8, 64):
        held = {t: model_state_bytes(counts, t, n) for t in TECHNIQUES}
        state = {t: e.sharded_state for t, e in held.items()}
        assert state["zero3"] <= state["zero2"] <= state["zero1"] <= state["ddp"], (n, state)
        assert state["zero3_offload"] <= state["zero3"] and state["zero2_offload"] <= state["zero2"]
        if mode == "full":   # FSDP and ZeRO-3 split the same 16 bytes a parameter, differently
            assert state["fsdp"] == pytest.approx(state["zero3"])
    at_8 = {t: model_state_bytes(counts, t, 8).total for t in TECHNIQUES}   # the gathered unit included
    assert at_8["zero3"] <= at_8["zero2"] <= at_8["zero1"] <= at_8["ddp"], at_8


def test_deepspeed_estimators_count_18_bytes_where_this_counts_16(monkeypatch):
    """DeepSpeed's own estimators (notebook 05 prints them) count 18 B / N of what stages 2 and 3 split: at
    stage 2 a 4-byte fp32 gradient partition beside this module's 14 B / N (their source's comment), at
    stage 3 2 B more than the ZeRO paper's 16 B / N. With offload they count what this module counts."""
    if "DS_ACCELERATOR" not in os.environ:   # the estimators need no GPU: keep DeepSpeed from probing one
        monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    stage2 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    counts = count_real_model("llama-3.2-1b")
    p, n = counts.total, 8
    _, gpu = stage2.estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=n, cpu_offload=False)
    assert gpu - model_state_bytes(counts, "zero2", n).total == pytest.approx(4 * p / n, abs=1)
    _, gpu = stage2.estimate_zero2_model_states_mem_needs(p, num_gpus_per_node=n, cpu_offload=True)
    assert gpu == model_state_bytes(counts, "zero2_offload", n).total
    largest = max(counts.largest_block, counts.outside_blocks)
    _, gpu, _ = estimate_zero3_model_states_mem_needs(p, largest, num_gpus_per_node=n, cpu_offload=False)
    own = model_state_bytes(counts, "zero3", n).sharded_state
    assert gpu - 4 * largest - own == pytest.approx(2 * p / n, abs=1)   # their 18 B / N against 16
    _, gpu, _ = estimate_zero3_model_states_mem_needs(p, largest, num_gpus_per_node=n, cpu_offload=True,
                                                      cpu_offload_params=False)
    assert gpu - 4 * largest == pytest.approx(model_state_bytes(counts, "zero3_offload", n).parameters, abs=1)


def test_nf4_bytes_are_what_bitsandbytes_stores():
    torch = pytest.importorskip("torch")
    functional = pytest.importorskip("bitsandbytes.functional")
    weight = torch.randn(256, 1024, dtype=torch.bfloat16)   # 4,096 blocks of 64: 16 groups of 256
    packed, state = functional.quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4")
    stored = [packed, state.absmax, state.state2.absmax, state.offset]
    per_weight = sum(t.numel() * t.element_size() for t in stored) / weight.numel()
    assert per_weight == pytest.approx(NF4_BYTES, abs=1e-4), per_weight


# ---- counting with peft -----------------------------------------------------------------------------------

def _tiny_llama():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


def _tiny_gpt_oss():
    from transformers import GptOssConfig

    return GptOssConfig(vocab_size=101, hidden_size=64, intermediate_size=64, head_dim=16,
                        num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                        num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                        tie_word_embeddings=False)


def _gpt_tiny():
    from helpers.models.gpt import gpt_config

    return gpt_config("tiny")


@pytest.mark.parametrize("build, lora", [
    (_tiny_llama, dict(r=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")),
    (_tiny_llama, dict(r=4, target_modules="all-linear", modules_to_save=["lm_head"],
                       ensure_weight_tying=True, task_type="CAUSAL_LM")),
    (_tiny_gpt_oss, dict(r=4, target_modules="all-linear", task_type="CAUSAL_LM",
                         target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])),
    (_gpt_tiny, dict(r=8, target_modules=["qkv", "attn_out", "mlp_in", "mlp_out"])),
], ids=["llama-some", "llama-all-linear-head", "gpt-oss-experts", "gallery-gpt"])
def test_lora_counts_are_peft_counts_on_a_real_model(build, lora):
    """The meta-device count equals peft's own count on the same model built with real weights."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, PretrainedConfig

    from helpers.models.gpt import GPT

    config = build()
    counts = count_parameters(config, LoraConfig(**lora))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config) if isinstance(config, PretrainedConfig) else GPT(config)
    trainable, everything = get_peft_model(model, LoraConfig(**lora)).get_nb_trainable_parameters()
    assert (counts.trainable, counts.total) == (trainable, everything)
    assert 0 < counts.trainable < counts.total


def test_one_lora_config_serves_several_models():
    """peft writes an "all-linear" target's names into its config; the count must not carry them over."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")
    first = count_parameters(_tiny_gpt_oss(), lora).trainable
    count_parameters(_tiny_llama(), lora)
    assert lora.target_modules == "all-linear"
    assert count_parameters(_tiny_gpt_oss(), lora).trainable == first


# ---- advice and tables ------------------------------------------------------------------------------------

def _sized(billions: float, trainable: float | None = None) -> ParamCounts:
    total = int(billions * 1e9)
    return ParamCounts("sized", total=total, trainable=int((trainable or billions) * 1e9),
                       largest_block=total // 50, outside_blocks=total // 50)


def test_which_technique_takes_the_simplest_that_fits():
    # 80 GB GPUs keep 60 GB for model state; full fine-tuning takes 16 B a parameter
    assert which_technique(_sized(3), 8, 80).technique == "ddp"            # 48 GB
    assert which_technique(_sized(7), 8, 80).technique == "fsdp"           # 112 GB, 14 + 0.6 sharded
    assert which_technique(_sized(100), 8, 80).technique == "zero3_offload"   # FSDP 208 GB, offload 33
    none = which_technique(_sized(400), 8, 80)
    assert none.technique is None and "FSDP fits on 256 such GPUs" in none.reason, none.reason
    no_cpu = which_technique(_sized(100), 8, 80, cpu_gb=512)             # 1,600 GB of CPU state
    assert no_cpu.technique is None and "CPU memory" in no_cpu.reason, no_cpu.reason


def test_which_technique_for_the_gpt_oss_lessons():
    """Notebook 07's choices: gpt-oss-20b with LoRA on DDP, -120b with LoRA needs FSDP (8 GPUs of 80 GB)."""
    assert which_technique(count_real_model("gpt-oss-20b", "lora"), 8, 80).technique == "ddp"
    assert which_technique(count_real_model("gpt-oss-120b", "full"), 8, 80).technique == "zero3_offload"


def test_technique_table_rows():
    rows = technique_table(["llama-3.2-1b"], world_size=8, gpu_gb=80, modes=["full", "qlora"])
    assert [r["trained"] for r in rows] == ["full fine-tuning", "QLoRA (4-bit base)"]
    counts = count_real_model("llama-3.2-1b")
    assert rows[0]["DDP"] == pytest.approx(16 * counts.total / 1e9)
    assert rows[0]["advice"] == "DDP" and set(TECHNIQUES.values()) <= set(rows[0])
    own = technique_table([count_parameters(_gpt_tiny(), name="notebook 04")], world_size=2)
    assert [r["model"] for r in own] == ["notebook 04"]


# ---- the command line -------------------------------------------------------------------------------------

def test_cli_prints_the_markdown_table(capsys):
    argv = ["--models", "llama-3.2-1b,olmo-3-7b", "--gpus", "8", "--gpu-gb", "80", "--modes", "full"]
    assert mp.main(argv) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("|")]
    assert lines[0].startswith("| model | trained |") and "ZeRO-3 + offload" in lines[0]
    assert lines[1].startswith("|---|")
    ddp = 16 * count_real_model("olmo-3-7b").total / 1e9
    assert lines[3].startswith("| olmo-3-7b | full fine-tuning |"), lines[3]
    assert f"| {ddp:.1f} ✗ |" in lines[3], lines[3]
    assert lines[3].endswith("| FSDP |")


def test_cli_help_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "helpers.memory_plan", "--help"], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--gpu-gb" in done.stdout and "gpt-oss-120b" in done.stdout


# ---- bad input names its fix ------------------------------------------------------------------------------

@pytest.mark.parametrize("call, fix", [
    (lambda: model_state_bytes(FULL, "zero4", 8), "'zero3'"),
    (lambda: model_state_bytes(FULL, "ddp", 0), "number of GPUs"),
    (lambda: model_state_bytes(FULL, "ddp", 8, optimizer="lion"), "'adamw'"),
    (lambda: count_real_model("llama-4"), "llama-3.2-1b"),
    (lambda: count_real_model("gpt-oss-20b", "dora"), "'qlora'"),
    (lambda: count_parameters(_tiny_llama(), load_in_4bit=True), "LoraConfig"),
    (lambda: which_technique(FULL, 8, 0), "80 for an H100"),
    (lambda: technique_table(["llama-3.2-1b"], techniques=["zero4"]), "'zero3'"),
])
def test_bad_input_names_the_fix(call, fix):
    with pytest.raises(ValueError) as caught:
        call()
    assert fix in str(caught.value), str(caught.value)


def test_a_config_of_another_kind_names_the_fix():
    with pytest.raises(TypeError, match="PretrainedConfig"):
        count_parameters({"hidden_size": 64})


def test_cli_rejects_an_unknown_model(capsys):
    with pytest.raises(SystemExit) as caught:
        mp.main(["--models", "llama-4"])
    assert caught.value.code == 2 and "gpt-oss-120b" in capsys.readouterr().err


# ---- against a real FSDP2 run -----------------------------------------------------------------------------

def test_fsdp_estimate_is_what_fully_shard_allocates():
    """Notebook 04's GPT in 2 gloo processes: each rank's shards hold the estimate's bytes, and all ranks
    together hold 4 B a parameter (params, gradients) and 8 B (AdamW moments), to the byte."""
    from benchmarks.memory_plan_fsdp import measure
    from helpers.models.gpt import gpt_config

    counts = count_parameters(gpt_config("tiny"))
    estimate = model_state_bytes(counts, "fsdp", 2)
    held = measure("tiny", 2)
    for role, per_param in (("parameters", 4), ("gradients", 4), ("optimizer", 8)):
        assert sum(h[role] for h in held) == per_param * counts.total, role
        for rank in held:
            assert rank[role] == pytest.approx(getattr(estimate, role), rel=0.02), (role, held)


def test_readme_figures_are_what_the_module_prints():
    """The README's model-state table is this module's output, not typed figures."""
    from helpers.paths import ROOT

    start, end = mp.README_MARKERS
    readme = (ROOT / "README.md").read_text()
    shown = readme.split(start, 1)[1].split(end, 1)[0].strip()
    assert shown == mp.readme_table(), (
        "README.md's model-state table differs from what the module prints: "
        "python -m helpers.memory_plan --write-readme")
