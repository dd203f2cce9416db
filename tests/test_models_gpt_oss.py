"""The MXFP4 path of notebook 07, offline, and the model helpers it calls.

A tiny GPT-OSS folder in the layout OpenAI ships (uint8 `*_blocks` / `*_scales` experts and
`quant_method: mxfp4` in its config) loads through `load_options`, is dequantized to bf16, and trains with
LoRA on the attention and expert weights, on the CPU, in a few seconds. `check_lora_targets` refuses a
target that matches nothing before any launch, and warns when FSDP with LoRA on the experts and gradient
checkpointing off would keep every layer's merged expert weights; `moe_sizes` counts a mixture of experts
on the meta device."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.models.gpt_oss import (
    EXPERT_MEMORY_SHARE,
    FP4_VALUES,
    ExpertLoraMemoryWarning,
    build_gpt_oss_checkpoint,
    check_expert_lora_memory,
    check_lora_targets,
    load_options,
    merged_expert_bytes,
    moe_sizes,
    quantize_mxfp4,
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt-oss")
    return {"mxfp4": build_gpt_oss_checkpoint(root / "mxfp4", mxfp4=True),
            "bf16": build_gpt_oss_checkpoint(root / "bf16", mxfp4=False)}


def test_quantization_matches_transformers_dequantizer():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    torch.manual_seed(0)
    weight = torch.randn(3, 64, 96) * 0.05
    blocks, scales = quantize_mxfp4(weight)
    assert blocks.dtype == scales.dtype == torch.uint8
    assert blocks.shape == (3, 96, 2, 16) and scales.shape == (3, 96, 2)
    restored = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert restored.shape == weight.shape
    # every value is an FP4 value times its block's power of two, the nearest one to the original
    step = torch.exp2(scales.float() - 127).repeat_interleave(32, dim=-1).transpose(1, 2)   # [E, in, out]
    assert torch.isin((restored / step).flatten(), torch.tensor(FP4_VALUES)).all()
    assert ((restored - weight).abs() <= step + 1e-9).all()


def test_checkpoint_has_the_published_layout(folders):
    from safetensors import safe_open

    config = json.loads((folders["mxfp4"] / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4"
    with safe_open(str(folders["mxfp4"] / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.layers.0.mlp.experts.gate_up_proj_blocks").dtype == torch.uint8
        assert f.get_tensor("model.layers.0.mlp.experts.down_proj_scales").dtype == torch.uint8
    assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in names)


def test_notebook_loads_mxfp4_dequantized_and_ordinary_checkpoints_plainly(folders):
    from transformers import AutoModelForCausalLM, Mxfp4Config

    options = load_options(str(folders["mxfp4"]), None)
    quantization = options["quantization_config"]
    assert isinstance(quantization, Mxfp4Config) and quantization.dequantize
    assert options["attn_implementation"] == "eager"
    model = AutoModelForCausalLM.from_pretrained(folders["mxfp4"], **options)
    experts = model.model.layers[0].mlp.experts
    assert type(experts).__name__ == "GptOssExperts" and experts.gate_up_proj.dtype == torch.bfloat16
    assert experts.gate_up_proj.shape == (4, 64, 128) and experts.gate_up_proj.abs().sum() > 0
    assert "quantization_config" not in load_options(str(folders["bf16"]), None)
    # why the notebook passes it only to MXFP4 checkpoints: an ordinary one refuses it
    with pytest.raises(Exception):  # noqa: B017 (transformers raises ValueError or KeyError by version)
        AutoModelForCausalLM.from_pretrained(folders["bf16"],
                                             quantization_config=Mxfp4Config(dequantize=True))


def test_lora_on_attention_and_experts_trains_the_dequantized_model(folders):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(folders["mxfp4"])
    model = AutoModelForCausalLM.from_pretrained(path, **load_options(path, None))
    tokenizer = AutoTokenizer.from_pretrained(path)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM",
                      target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    model = get_peft_model(model, lora)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    experts_b = {n: p.detach().clone() for n, p in trainable.items() if ".experts." in n and "lora_B" in n}
    assert experts_b and all(p.abs().sum() == 0 for p in experts_b.values())   # B starts at zero
    chat = [{"role": "user", "content": "reverse: abc"}, {"role": "assistant", "content": "cba"}]
    batch = tokenizer([tokenizer.apply_chat_template(chat, tokenize=False)] * 4, return_tensors="pt")
    optimizer = torch.optim.AdamW(trainable.values(), lr=1e-2)
    losses, seen = [], set()
    for _ in range(3):
        loss = model(**batch, labels=batch["input_ids"]).loss
        loss.backward()
        seen |= {n for n, p in trainable.items() if p.grad is not None and p.grad.abs().sum() > 0}
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert seen == set(trainable), f"no gradient reached {sorted(set(trainable) - seen)[:3]}"
    assert all((trainable[n].detach() - b).abs().sum() > 0 for n, b in experts_b.items())


def _tiny_config():
    from helpers.models.gpt_oss import gpt_oss_config

    return gpt_oss_config(40, hidden_size=64, layers=2, experts=4, experts_per_token=2)


def _lora(**changes):
    from peft import LoraConfig

    options = dict(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM",
                   target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    return LoraConfig(**{**options, **changes})


def test_lora_targets_are_counted_on_the_meta_device():
    targets = check_lora_targets(_tiny_config(), _lora())
    assert targets["adapted"] == ["down_proj", "gate_up_proj", "k_proj", "o_proj", "q_proj", "v_proj"]
    assert 0 < targets["trainable"] < targets["total"]
    assert str(targets).startswith(f"{targets['trainable']:,} trainable parameters of {targets['total']:,}")
    only_attention = check_lora_targets(_tiny_config(),
                                        _lora(target_modules=["q_proj"], target_parameters=[]))
    assert only_attention["adapted"] == ["q_proj"] and only_attention["trainable"] < targets["trainable"]


@pytest.mark.parametrize("changes, message", [
    (dict(target_parameters=["mlp.experts.up_proj"]), r"'mlp.experts.up_proj' matches no parameter"),
    (dict(target_modules=["qkv_proj"]), r"lora_target_modules=\['qkv_proj'\] matches nothing"),
    (dict(target_modules=r".*\.qkv_proj"), r"matches nothing in this model"),
])
def test_a_lora_target_that_matches_nothing_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        check_lora_targets(_tiny_config(), _lora(**changes))


def test_moe_sizes_count_experts_and_what_a_token_computes_with():
    config = _tiny_config()
    sizes = moe_sizes({"tiny": config})["tiny"]
    with torch.device("meta"):
        from transformers import GptOssForCausalLM

        model = GptOssForCausalLM(config)
    assert sizes["parameters"] == sum(p.numel() for p in model.parameters())
    # 2 of 4 experts a token: half the expert weights are left out of what it computes with
    assert sizes["parameters"] - sizes["active per token"] == sizes["in experts"] // 2
    assert (sizes["layers"], sizes["experts"], sizes["top-k"]) == (2, 4, 2)


def test_fsdp_expert_lora_without_checkpointing_warns_at_depth_and_only_then():
    """The 24-layer shape of issue 53 (hidden 576, 16 experts: 1.5 GB of fp32 expert weights) against a
    process with 4 GB: warned, naming the fix; the tiny default model, checkpointing on, DDP or no expert
    LoRA: quiet."""
    from types import SimpleNamespace

    from helpers.models.gpt_oss import gpt_oss_config

    deep = gpt_oss_config(40, hidden_size=576, layers=24, experts=16)
    merged = merged_expert_bytes(deep, _lora())
    assert merged == 4 * 24 * 16 * 576 * (2 * 576 + 576)   # gate_up [E, h, 2i] + down [E, i, h], fp32
    small = 4 * 10**9
    assert merged > EXPERT_MEMORY_SHARE * small
    fsdp = dict(strategy="fsdp", checkpointing=False, memory_bytes=small)
    with pytest.warns(ExpertLoraMemoryWarning, match=r"-p gradient_checkpointing True"):
        assert "1.5 GB" in check_expert_lora_memory(deep, _lora(), **fsdp)
    with pytest.warns(ExpertLoraMemoryWarning, match=r"merged expert weights"):   # where 07 calls it
        check_lora_targets(deep, _lora(), strategy="fsdp", checkpointing=False,
                           plan=SimpleNamespace(device="cpu", processes=10**6))   # 1/10**6 of host RAM
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_expert_lora_memory(_tiny_config(), _lora(), **fsdp) is None
        assert check_expert_lora_memory(deep, _lora(), **dict(fsdp, checkpointing=True)) is None
        assert check_expert_lora_memory(deep, _lora(), **dict(fsdp, strategy="ddp")) is None
        assert check_expert_lora_memory(deep, _lora(target_parameters=[]), **fsdp) is None
        check_lora_targets(_tiny_config(), _lora(), strategy="fsdp", checkpointing=False,
                           plan=SimpleNamespace(device="cpu", processes=2))
