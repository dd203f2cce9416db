"""The published models the memory plan counts, built offline from the values of their config.json, and the
LoRA configuration the gallery's notebook for each model family uses.

Why: a plan for a real model needs its real shapes, and downloading a 120B checkpoint to read them is not an
option; the configurations are typed in from each model's config.json (only what differs from transformers'
defaults), so `helpers.param_counts` can build the model on the meta device from them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _llama_3_2(hidden_size: int, layers: int, heads: int):
    from transformers import LlamaConfig

    # meta-llama/Llama-3.2-1B and -3B (and -Instruct) config.json: the shared values
    return LlamaConfig(vocab_size=128256, hidden_size=hidden_size, intermediate_size=8192,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=8,
                       head_dim=hidden_size // heads, max_position_embeddings=131072, rope_theta=500000.0,
                       rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                       tie_word_embeddings=True)


def _olmo_3_7b():
    from transformers import Olmo3Config

    # allenai/Olmo-3-1025-7B (and -7B-Instruct) config.json; Olmo3Config()'s defaults differ (its vocabulary)
    return Olmo3Config(vocab_size=100278, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=65536,
                       sliding_window=4096, rope_theta=500000.0, tie_word_embeddings=False)


def _gpt_oss(layers: int, experts: int):
    from transformers import GptOssConfig

    # openai/gpt-oss-20b and -120b config.json: only depth and the number of experts differ
    return GptOssConfig(vocab_size=201088, hidden_size=2880, intermediate_size=2880, head_dim=64,
                        num_attention_heads=64, num_key_value_heads=8, num_hidden_layers=layers,
                        num_local_experts=experts, num_experts_per_tok=4, sliding_window=128,
                        max_position_embeddings=131072, tie_word_embeddings=False)


def _lora_projections():
    from peft import LoraConfig

    # notebook 08 (Unsloth, Llama 3.2): r=16 on the seven projections
    return LoraConfig(r=16, lora_alpha=16, task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                      "gate_proj", "up_proj", "down_proj"])


def _lora_all_linear():
    from peft import LoraConfig

    # notebook 09 (Axolotl, OLMo 3): r=16 on every linear layer (lora_target_linear)
    return LoraConfig(r=16, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")


def _lora_gpt_oss():
    from peft import LoraConfig

    # notebook 07 (TRL, GPT-OSS): r=16 on every linear layer and on the expert weights
    return LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM",
                      target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])


@dataclass(frozen=True)
class RealModel:
    """A published model: its configuration and the LoRA configuration the gallery's notebook uses."""

    config: Callable[[], Any]
    lora: Callable[[], Any]
    source: str


REAL_MODELS = {
    "llama-3.2-1b": RealModel(functools.partial(_llama_3_2, 2048, 16, 32), _lora_projections,
                              "meta-llama/Llama-3.2-1B"),
    "llama-3.2-3b": RealModel(functools.partial(_llama_3_2, 3072, 28, 24), _lora_projections,
                              "meta-llama/Llama-3.2-3B"),
    "olmo-3-7b": RealModel(_olmo_3_7b, _lora_all_linear, "allenai/Olmo-3-1025-7B"),
    "gpt-oss-20b": RealModel(functools.partial(_gpt_oss, 24, 32), _lora_gpt_oss, "openai/gpt-oss-20b"),
    "gpt-oss-120b": RealModel(functools.partial(_gpt_oss, 36, 128), _lora_gpt_oss, "openai/gpt-oss-120b"),
}


def real_model(name: str) -> RealModel:
    """The entry of REAL_MODELS named `name`; a name outside them is refused with what to do instead."""
    if name not in REAL_MODELS:
        raise ValueError(f"model {name!r} is not one of {', '.join(REAL_MODELS)}; for another model pass its "
                         "config to count_parameters (AutoConfig.from_pretrained(folder) reads only its "
                         "config.json).")
    return REAL_MODELS[name]


def real_config(name: str):
    """The published model's configuration (transformers), built offline from its config.json values."""
    return real_model(name).config()


def real_lora(name: str):
    """The peft LoraConfig the gallery's notebook for this model family uses."""
    return real_model(name).lora()
