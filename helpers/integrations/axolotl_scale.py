"""What notebook 09's recipe needs at real size: OLMo 3 7B under DDP, per GPU and per process.

The model is built from its published configuration on the `meta` device (shapes, no memory,
`helpers.memory_plan`), peft applies the notebook's LoRA settings to it (the embeddings frozen, as for a
`model_name`), and each parameter costs what DDP keeps of it: a frozen weight 2 bytes in bf16 or about half
a byte in NF4, a trained one its fp32 value, gradient and two AdamW moments. Under DDP every GPU holds all
of it, whatever the number of GPUs; activations come on top. The placement table says where the whole model
lives in each process of the lesson, and why that fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from helpers.memory_plan import GB, ParamCounts, count_parameters, model_state_bytes, which_technique

# A common GPU for QLoRA: what the verdicts and the placement table size against.
GPU_GB = 24
# The model the lesson scales to, by its name in helpers.memory_plan.REAL_MODELS.
REAL_MODEL = "olmo-3-7b"
COLUMNS = {"weights": "parameters", "gradients": "gradients", "AdamW state": "optimizer", "total": "total"}


@dataclass(frozen=True)
class AtScale:
    """The tables and the lines the Scaling-up cell shows."""

    per_gpu: Any       # DataFrame: model state per GPU under DDP, by recipe (MB)
    placement: Any     # DataFrame: where OLMo 3 7B lives in each process (GB)
    verdicts: list[str]

    def show(self) -> Any:
        """Print the verdicts and the placement; return the per-GPU table (the cell's last value)."""
        print("\n".join(self.verdicts))
        print(self.placement.to_string())
        return self.per_gpu


def lora_for(r: int, alpha: float, targets: Sequence[str] | None) -> Any:
    """The notebook's LoRA settings as a model_name gets them: every linear layer (or `targets`), the
    embeddings frozen."""
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, task_type="CAUSAL_LM",
                      target_modules="all-linear" if targets is None else list(targets))


def olmo3_7b_under_ddp(planned: ParamCounts, *, lora_r: int, lora_alpha: float,
                       lora_target_modules: Sequence[str] | None, world_size: int,
                       gpu_gb: float = GPU_GB) -> AtScale:
    """The notebook's own model as trained (`planned`) beside OLMo 3 7B with bf16 LoRA, 4-bit QLoRA and full
    fine-tuning, each as DDP holds it on every one of `world_size` GPUs; which technique each 7B recipe needs
    on 8 GPUs of `gpu_gb`; and where the whole 7B model lives in each process of the lesson."""
    import pandas as pd

    from helpers.memory_plan import real_config

    reference, lora = real_config(REAL_MODEL), lora_for(lora_r, lora_alpha, lora_target_modules)
    name = "OLMo 3 7B"
    plans = {"this model, as trained here": planned,
             "OLMo 3 7B, bf16 LoRA": count_parameters(reference, lora=lora, name=name),
             "OLMo 3 7B, 4-bit QLoRA": count_parameters(reference, lora=lora, load_in_4bit=True, name=name),
             "OLMo 3 7B, full fine-tuning": count_parameters(reference, name=name)}
    per_gpu = {recipe: model_state_bytes(counts, "ddp", world_size=world_size)
               for recipe, counts in plans.items()}
    table = pd.DataFrame({recipe: {"trainable parameters": f"{counts.trainable:,}",
                                   "trainable share": f"{counts.trainable / counts.total:.2%}",
                                   **{f"{k} (MB)": round(getattr(per_gpu[recipe], a) / 1e6, 1)
                                      for k, a in COLUMNS.items()}}
                          for recipe, counts in plans.items()}).T
    verdicts = [f"{recipe} on {gpu_gb:g} GB GPUs: "
                f"{which_technique(plans[recipe], world_size=8, gpu_gb=gpu_gb).reason}"
                for recipe in ("OLMo 3 7B, 4-bit QLoRA", "OLMo 3 7B, full fine-tuning")]
    qlora = per_gpu["OLMo 3 7B, 4-bit QLoRA"]
    verdicts.append("DDP averages the 7B adapters' gradients every step: "
                    f"{qlora.gradients / 1e6:.0f} MB in fp32")
    bf16_gb = plans["OLMo 3 7B, full fine-tuning"].total * 2 / GB   # the published weights in bf16
    gpu = f"its own GPU, {gpu_gb:g} GB"
    placement = pd.DataFrame([
        ("this kernel", "-", "nothing (config on meta, tokenizer)", 0.0),
        ("every rank, training (Axolotl, DDP)", gpu, "whole, NF4 + adapters + AdamW", qlora.total / GB),
        ("every rank, evaluation (evaluate_checkpoint)", gpu, "whole, bf16 + adapters", bf16_gb),
        ("rank 0, merge and save", gpu, "whole, bf16, merged in place", bf16_gb),
    ], columns=["process", "device", "OLMo 3 7B held", "model state (GB)"]).set_index("process").round(1)
    return AtScale(table, placement, verdicts)
