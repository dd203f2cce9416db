"""OLMo 3 configurations side by side: what makes a checkpoint OLMo 3, read from its config.

Notebook 09 builds a tiny `Olmo3ForCausalLM` from an `Olmo3Config` in view (the model is the lesson's); this
module only lays its configuration beside the published OLMo 3 7B's (`helpers.memory_plan.real_config`), so a
reader sees which of the architecture's traits the tiny one keeps: sliding-window layers and full-attention
ones (`layer_types`), the head counts, the vocabulary, and the parameter count (a model built on the `meta`
device: nothing allocated).
"""

from __future__ import annotations

from typing import Any


def parameter_count(config: Any) -> int:
    """The parameters of the causal LM `config` describes, counted on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def architecture(config: Any) -> dict[str, Any]:
    """One column of `architecture_table`: the traits of `config` a reader compares."""
    return {"layers": config.num_hidden_layers, "hidden size": config.hidden_size,
            "MLP size": config.intermediate_size,
            "heads / KV heads": f"{config.num_attention_heads} / {config.num_key_value_heads}",
            "sliding window": getattr(config, "sliding_window", None),
            "full-attention layers": sum(t == "full_attention" for t in getattr(config, "layer_types", [])
                                         or []),
            "vocabulary": config.vocab_size, "parameters": f"{parameter_count(config):,}"}


def architecture_table(**configs: Any) -> Any:
    """A DataFrame with one column per named config: `architecture_table(**{"this model": c, ...})`."""
    import pandas as pd

    return pd.DataFrame({name: architecture(config) for name, config in configs.items()})


def beside_olmo3_7b(config: Any, name: str = "this model") -> Any:
    """`config`'s column beside the published OLMo 3 7B's (its config.json, from helpers.memory_plan)."""
    from helpers.memory_plan import real_config

    return architecture_table(**{name: config, "OLMo 3 7B": real_config("olmo-3-7b")})
