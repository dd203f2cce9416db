"""Per-GPU memory of model state (parameters, gradients, optimizer state) for each way of training a model.

Why: which technique a model needs (DDP, FSDP, DeepSpeed ZeRO 1/2/3, ZeRO with CPU offload; full fine-tuning,
LoRA or QLoRA) follows from a few bytes a parameter and how each technique splits them over the GPUs. The
parameter counts come from the model itself: it is built on the `meta` device (shapes, no memory) from its
configuration, and a LoRA configuration is applied to it with peft, so the trainable count is peft's own.
Nothing here is a typed-in share or parameter count.

    counts = count_parameters(real_config("gpt-oss-120b"), lora=real_lora("gpt-oss-120b"))
    model_state_bytes(counts, "fsdp", world_size=8).as_gb()
    which_technique(counts, world_size=8, gpu_gb=80)

    python -m helpers.memory_plan --models all --gpus 8 --gpu-gb 80     # the table, in markdown

Bytes a parameter, mixed precision as the notebooks train (bf16 compute, fp32 master weights, AdamW):

* PyTorch's own wrappers (DDP, FSDP2) keep what is trained in fp32: the parameter 4 B, its gradient 4 B,
  Adam's two moments 8 B (FSDP2's sharded parameter is the fp32 master; it gathers a bf16 copy to compute).
* DeepSpeed ZeRO keeps 16-bit parameters 2 B and gradients 2 B, and an optimizer state of an fp32 master
  copy 4 B plus the moments 8 B (the ZeRO paper's K = 12): the same 16 B in all.
* A frozen parameter (LoRA's base weights) is only stored: 2 B in bf16, or NF4 4-bit (QLoRA: the weights of
  the linear layers but the output head, as bitsandbytes converts them; the rest stays bf16).
* LoRA's adapters are trained like any parameter (peft keeps them in fp32 beside a bf16 base).

How each technique splits them over N GPUs (T trainable, W the frozen weights' bytes):

    DDP               every GPU: all of it
    ZeRO-1            optimizer state / N
    ZeRO-2            optimizer state and gradients / N
    ZeRO-3, FSDP      everything / N, plus the unit being computed, gathered in 16 bits
    ZeRO-2 + offload  parameters on every GPU; gradients and optimizer state (fp32) in CPU memory
    ZeRO-3 + offload  parameters / N on the GPUs (plus the gathered unit); the rest in CPU memory

The gathered unit of FSDP and ZeRO-3 is the largest repeated block (a transformer layer) plus what lies
outside the blocks (embeddings, final norm, head): FSDP2 keeps the root's parameters gathered through forward
and backward when each block and then the whole model are wrapped, as notebook 04 does. ZeRO-3 gathers
module by module, so there this is an upper bound.

Not counted: activations (they depend on batch and sequence length), communication buckets, the CUDA context,
autocast's cached bf16 copies of the weights, allocator fragmentation. `which_technique` keeps a share of
each GPU (`headroom`) for them. GB here are 1e9 bytes.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GB = 1e9
TECHNIQUES = {"ddp": "DDP", "fsdp": "FSDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
              "zero2_offload": "ZeRO-2 + offload", "zero3_offload": "ZeRO-3 + offload"}
MODES = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA (4-bit base)"}
# fp32 optimizer state a trained parameter, beside any master copy: Adam's two moments, SGD's momentum
OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd": 4}
# bitsandbytes NF4 as QLoRA recipes load it (bnb_4bit_use_double_quant=True, blocksize 64): half a byte a
# weight, one uint8 absmax a block of 64, one fp32 scale a group of 256 blocks (tests/test_memory_plan.py
# quantizes a tensor with bitsandbytes and checks this)
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
BF16_BYTES = 2
# The share of each GPU left for activations and buffers when deciding what fits
DEFAULT_HEADROOM = 0.25
# which_technique tries these in order: the simplest that fits wins
_ADVICE_ORDER = ("ddp", "fsdp", "zero3_offload")


@dataclass(frozen=True)
class ParamCounts:
    """What a model holds, counted on the meta device (tied weights once).

    total: every parameter (LoRA's adapters included); trainable: those with requires_grad; quantizable: the
    frozen weights bitsandbytes stores in 4 bits under QLoRA (linear layers but the output head);
    largest_block / outside_blocks: the parameters of the largest repeated block and of everything outside
    the blocks, with the quantizable part of each (what FSDP and ZeRO-3 gather at once).
    """

    name: str
    total: int
    trainable: int
    quantizable: int = 0
    largest_block: int = 0
    largest_block_quantizable: int = 0
    outside_blocks: int = 0
    outside_blocks_quantizable: int = 0
    load_in_4bit: bool = False

    def __post_init__(self):
        if not 0 <= self.trainable <= self.total:
            raise ValueError(f"{self.name}: trainable={self.trainable} must lie in 0..total ({self.total}).")
        if self.load_in_4bit and self.trainable == self.total:
            raise ValueError(f"{self.name}: 4-bit weights cannot be trained in full; pass a LoRA config "
                             "(QLoRA) or load_in_4bit=False.")

    @property
    def frozen(self) -> int:
        return self.total - self.trainable

    @property
    def mode(self) -> str:
        """'full', 'lora' (something frozen) or 'qlora' (frozen weights in 4 bits)."""
        return "full" if self.frozen == 0 else "qlora" if self.load_in_4bit else "lora"

    def stored_bytes(self, params: int, quantizable: int) -> float:
        """Bytes of `params` 16-bit weights of which `quantizable` are 4-bit under QLoRA."""
        if not self.load_in_4bit:
            return BF16_BYTES * params
        return BF16_BYTES * (params - quantizable) + NF4_BYTES * quantizable

    @property
    def frozen_bytes(self) -> float:
        """The frozen weights, stored: bf16, or NF4 for the quantizable ones under QLoRA."""
        return self.stored_bytes(self.frozen, min(self.quantizable, self.frozen))

    @property
    def block_bytes(self) -> float:
        """The largest block (a layer) in its 16-bit (or 4-bit) compute copy: what FSDP gathers per layer."""
        return self.stored_bytes(self.largest_block, self.largest_block_quantizable)

    @property
    def outside_bytes(self) -> float:
        """Everything outside the blocks (embeddings, final norm, head) in its compute copy."""
        return self.stored_bytes(self.outside_blocks, self.outside_blocks_quantizable)

    @property
    def gathered_bytes(self) -> float:
        """One block and everything outside the blocks, in their 16-bit (or 4-bit) compute copy."""
        return self.block_bytes + self.outside_bytes


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a GPU holds for model state under one technique, by role; `cpu` is each rank's CPU share."""

    technique: str
    world_size: int
    parameters: float
    gradients: float
    optimizer: float
    gathered: float = 0.0
    cpu: float = 0.0

    @property
    def total(self) -> float:
        """GPU bytes in all: parameters, gradients, optimizer state and the gathered unit."""
        return self.parameters + self.gradients + self.optimizer + self.gathered

    @property
    def sharded_state(self) -> float:
        """GPU bytes without the gathered unit: what the technique keeps between steps."""
        return self.parameters + self.gradients + self.optimizer

    def as_gb(self) -> dict[str, float]:
        """The breakdown in GB (1e9 bytes), for a table."""
        return {"parameters": self.parameters / GB, "gradients": self.gradients / GB,
                "optimizer state": self.optimizer / GB, "gathered unit": self.gathered / GB,
                "total (GPU)": self.total / GB, "CPU per rank": self.cpu / GB}


@dataclass(frozen=True)
class Advice:
    """which_technique's answer: the technique (None when nothing fits), its estimate and why."""

    technique: str | None
    estimate: MemoryEstimate | None
    reason: str


# ---- counting ---------------------------------------------------------------------------------------------

def _check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: give the number of GPUs (processes), a whole number "
                         "of 1 or more.")


def _meta_model(config: Any):
    """The model of `config` on the meta device, and its output head (bitsandbytes keeps it in 16 bits)."""
    import torch

    from helpers.models.gpt import GPT, GPTConfig

    if isinstance(config, GPTConfig):
        with torch.device("meta"):
            model = GPT(config)
        return model, model.head
    from transformers import AutoModel, AutoModelForCausalLM, PretrainedConfig

    if not isinstance(config, PretrainedConfig):
        raise TypeError(f"config is a {type(config).__name__}: give a transformers PretrainedConfig (e.g. "
                        "AutoConfig.from_pretrained(folder), or real_config(name) for one of "
                        f"{', '.join(REAL_MODELS)}) or the gallery's GPTConfig "
                        "(helpers.models.gpt.gpt_config()).")
    with torch.device("meta"):
        try:
            model = AutoModelForCausalLM.from_config(config)
        except ValueError:   # not a causal LM (an encoder, say): count its base model
            model = AutoModel.from_config(config)
    return model, model.get_output_embeddings()


def _unique(params: Iterable) -> dict[int, Any]:
    return {id(p): p for p in params}


def _block_counts(model, quantizable_ids: set[int]) -> tuple[int, int, int, int]:
    """(largest block, its quantizable part, outside the blocks, its quantizable part) of the model.

    The blocks are the children of the largest `nn.ModuleList` (a transformer's layers)."""
    import torch.nn as nn

    everything = _unique(model.parameters())

    def size(params: dict[int, Any]) -> tuple[int, int]:
        return (sum(p.numel() for p in params.values()),
                sum(p.numel() for i, p in params.items() if i in quantizable_ids))

    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:   # no repeated blocks: the whole model is one unit
        return 0, 0, *size(everything)
    layers = max(lists, key=lambda m: sum(p.numel() for p in _unique(m.parameters()).values()))
    blocks = [size(_unique(block.parameters())) for block in layers]
    in_blocks = _unique(layers.parameters())
    outside = {i: p for i, p in everything.items() if i not in in_blocks}
    return (*max(blocks), *size(outside))


def count_parameters(config: Any, lora: Any = None, load_in_4bit: bool = False,
                     name: str | None = None) -> ParamCounts:
    """Count the model of `config` (a transformers `PretrainedConfig` or the gallery's `GPTConfig`), built on
    the meta device, with `lora` (a peft `LoraConfig`) applied by peft when given.

    `load_in_4bit=True` (with a LoRA config: QLoRA) stores the frozen linear weights in NF4. Nothing is
    allocated, so the 120B model counts in seconds on a laptop.
    """
    import torch
    import torch.nn as nn

    if load_in_4bit and lora is None:
        raise ValueError("load_in_4bit=True without lora: 4-bit weights cannot be trained in full; pass "
                         "lora=LoraConfig(...) (QLoRA) or load_in_4bit=False.")
    model, head = _meta_model(config)
    head_ids = set() if head is None else {id(p) for p in head.parameters()}
    quantizable_ids = {id(m.weight) for m in model.modules()
                       if isinstance(m, nn.Linear) and id(m.weight) not in head_ids}
    quantizable = sum(p.numel() for i, p in _unique(model.parameters()).items() if i in quantizable_ids)
    blocks = _block_counts(model, quantizable_ids)
    if lora is not None:
        from peft import get_peft_model

        # peft writes into its config (an "all-linear" target becomes this model's layer names): use a copy;
        # on the meta device, or the adapters (GBs for gpt-oss-120b) are allocated before peft moves them
        with torch.device("meta"):
            model = get_peft_model(model, copy.deepcopy(lora))
    params = _unique(model.parameters()).values()
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    return ParamCounts(name=name or type(config).__name__.removesuffix("Config"), total=total,
                       trainable=trainable, quantizable=quantizable, largest_block=blocks[0],
                       largest_block_quantizable=blocks[1], outside_blocks=blocks[2],
                       outside_blocks_quantizable=blocks[3], load_in_4bit=load_in_4bit)


# ---- the arithmetic ---------------------------------------------------------------------------------------

def model_state_bytes(counts: ParamCounts, technique: str, world_size: int,
                      optimizer: str = "adamw") -> MemoryEstimate:
    """Bytes of model state one GPU holds when `counts`' model trains with `technique` on `world_size` GPUs.

    The layouts are in the module's docstring; `optimizer` is "adamw" (two fp32 moments) or "sgd" (momentum).
    """
    if technique not in TECHNIQUES:
        raise ValueError(f"technique={technique!r}: use one of {', '.join(map(repr, TECHNIQUES))}.")
    _check_world_size(world_size)
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer={optimizer!r}: use one of "
                         f"{', '.join(map(repr, OPTIMIZER_STATE_BYTES))}.")
    n, t, w = world_size, counts.trainable, counts.frozen_bytes
    moments = OPTIMIZER_STATE_BYTES[optimizer]
    if technique == "ddp":            # fp32 trainable parameters, gradients, moments: all on every GPU
        return MemoryEstimate(technique, n, w + 4 * t, 4 * t, moments * t)
    if technique == "fsdp":           # the same, sharded; the unit being computed gathered in bf16
        return MemoryEstimate(technique, n, (w + 4 * t) / n, 4 * t / n, moments * t / n,
                              gathered=counts.gathered_bytes)
    # DeepSpeed: 16-bit parameters and gradients; optimizer state = fp32 master copy + moments
    state = (4 + moments) * t
    if technique == "zero1":
        return MemoryEstimate(technique, n, w + 2 * t, 2 * t, state / n)
    if technique == "zero2":
        return MemoryEstimate(technique, n, w + 2 * t, 2 * t / n, state / n)
    if technique == "zero3":
        return MemoryEstimate(technique, n, (w + 2 * t) / n, 2 * t / n, state / n,
                              gathered=counts.gathered_bytes)
    cpu = (4 * t + state) / n   # offload: the fp32 gradient partition, master copy and moments in CPU memory
    if technique == "zero2_offload":
        return MemoryEstimate(technique, n, w + 2 * t, 0.0, 0.0, cpu=cpu)
    return MemoryEstimate(technique, n, (w + 2 * t) / n, 0.0, 0.0, gathered=counts.gathered_bytes, cpu=cpu)


def fsdp_with_layers_in_flight(counts: ParamCounts, estimate: MemoryEstimate, layers: float) -> float:
    """GPU bytes of FSDP's model state when `layers` layers' worth are gathered at once, beside the sharded
    state and the root's embeddings and head: what a measured count of layers in flight
    (benchmarks/llm_memory.py, under expert LoRA) makes of the plan's one gathered layer."""
    if estimate.technique != "fsdp":
        raise ValueError(f"layers in flight are FSDP's; this estimate is {estimate.technique!r}")
    return estimate.sharded_state + counts.outside_bytes + layers * counts.block_bytes


def which_technique(counts: ParamCounts, world_size: int, gpu_gb: float, headroom: float = DEFAULT_HEADROOM,
                    optimizer: str = "adamw", cpu_gb: float | None = None) -> Advice:
    """The simplest technique whose model state fits each GPU, keeping `headroom` of it for activations.

    The rule: DDP when the whole model state fits one GPU (no gathers: the fastest and simplest); FSDP
    (or ZeRO-3, the same split) when it does not but its shard does; ZeRO-3 with the optimizer state
    offloaded to CPU memory for the largest; otherwise nothing on this many GPUs (the reason says how
    many FSDP needs). ZeRO-1 and -2 lie between DDP and FSDP; the table shows them. With `cpu_gb` (the CPU
    memory of the machine the `world_size` GPUs share), offload counts only where its CPU share fits there.
    """
    _check_world_size(world_size)
    if not gpu_gb > 0:
        raise ValueError(f"gpu_gb={gpu_gb!r}: give each GPU's memory in GB (80 for an H100), more than 0.")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom={headroom!r}: the share of each GPU kept for activations lies in [0, 1), "
                         f"e.g. {DEFAULT_HEADROOM}.")
    budget = gpu_gb * GB * (1 - headroom)
    where = f"{budget / GB:.1f} GB of each {gpu_gb:g} GB GPU ({headroom:.0%} kept for activations)"
    estimates = {t: model_state_bytes(counts, t, world_size, optimizer) for t in _ADVICE_ORDER}
    ddp, fsdp, offload = estimates.values()
    if ddp.total <= budget:
        return Advice("ddp", ddp, f"DDP: the whole model state, {ddp.total / GB:.1f} GB, fits in {where}; "
                                  "every GPU keeps a copy and nothing is gathered.")
    if fsdp.total <= budget:
        return Advice("fsdp", fsdp, f"FSDP: DDP would need {ddp.total / GB:.1f} GB a GPU; sharded over "
                                    f"{world_size} GPUs it needs {fsdp.total / GB:.1f} GB, within {where}.")
    cpu_fits = cpu_gb is None or offload.cpu * world_size <= cpu_gb * GB
    if offload.total <= budget and cpu_fits:
        return Advice("zero3_offload", offload,
                      f"ZeRO-3 + offload: FSDP would need {fsdp.total / GB:.1f} GB a GPU; with the optimizer "
                      f"state in CPU memory ({offload.cpu * world_size / GB:.0f} GB in all) the GPUs keep "
                      f"{offload.total / GB:.1f} GB each, within {where}.")
    needed = next((g for g in (2 ** k for k in range(1, 15))
                   if model_state_bytes(counts, "fsdp", g, optimizer).total <= budget), None)
    more = f"FSDP fits on {needed} such GPUs" if needed else "no number of such GPUs holds one gathered unit"
    offloaded = (f"ZeRO-3 + offload needs {offload.total / GB:.1f} GB a GPU" if offload.total > budget else
                 f"ZeRO-3 + offload needs {offload.cpu * world_size / GB:.0f} GB of CPU memory, over "
                 f"{cpu_gb:g}")
    return Advice(None, None, f"nothing fits {world_size} GPUs: FSDP needs {fsdp.total / GB:.1f} GB a GPU, "
                              f"over {where}, and {offloaded}. {more}; or train LoRA / QLoRA.")


# ---- the real models, from their published config.json ----------------------------------------------------

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


def _real(name: str) -> RealModel:
    if name not in REAL_MODELS:
        raise ValueError(f"model {name!r} is not one of {', '.join(REAL_MODELS)}; for another model pass its "
                         "config to count_parameters (AutoConfig.from_pretrained(folder) reads only its "
                         "config.json).")
    return REAL_MODELS[name]


def real_config(name: str):
    """The published model's configuration (transformers), built offline from its config.json values."""
    return _real(name).config()


def real_lora(name: str):
    """The peft LoraConfig the gallery's notebook for this model family uses."""
    return _real(name).lora()


@functools.cache
def _real_counts(name: str, lora: bool) -> ParamCounts:
    model = _real(name)
    return count_parameters(model.config(), model.lora() if lora else None, name=name)


def count_real_model(name: str, mode: str = "full") -> ParamCounts:
    """The counts of a published model for one way of training it: "full", "lora" or "qlora"."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use one of {', '.join(map(repr, MODES))}.")
    counts = _real_counts(name, mode != "full")
    return dataclasses.replace(counts, load_in_4bit=True) if mode == "qlora" else counts


# ---- tables -----------------------------------------------------------------------------------------------

def technique_table(models: Iterable[str | ParamCounts] = tuple(REAL_MODELS), world_size: int = 8,
                    gpu_gb: float = 80.0, modes: Sequence[str] = tuple(MODES),
                    techniques: Sequence[str] = tuple(TECHNIQUES), optimizer: str = "adamw",
                    headroom: float = DEFAULT_HEADROOM, cpu_gb: float | None = None) -> list[dict[str, Any]]:
    """One row per model and way of training: sizes, GB per GPU under each technique, the advice.

    `models` holds names of REAL_MODELS (a row for each of `modes`) or ParamCounts (one row each, for a
    notebook's own model). `pandas.DataFrame(rows)` displays them.
    """
    _check_world_size(world_size)
    unknown = [t for t in techniques if t not in TECHNIQUES]
    if unknown:
        raise ValueError(f"techniques {unknown}: use names from {', '.join(map(repr, TECHNIQUES))}.")
    rows = []
    for model in models:
        if isinstance(model, str):
            _real(model)
            all_counts = [count_real_model(model, mode) for mode in modes]
        else:
            all_counts = [model]
        for counts in all_counts:
            row: dict[str, Any] = {"model": counts.name, "trained": MODES[counts.mode],
                                   "parameters (B)": counts.total / 1e9,
                                   "trainable (M)": counts.trainable / 1e6}
            for technique in techniques:
                estimate = model_state_bytes(counts, technique, world_size, optimizer)
                row[TECHNIQUES[technique]] = estimate.total / GB
            if "zero3_offload" in techniques:
                row["offload CPU, all ranks"] = (model_state_bytes(counts, "zero3_offload", world_size,
                                                                   optimizer).cpu * world_size / GB)
            advice = which_technique(counts, world_size, gpu_gb, headroom, optimizer, cpu_gb)
            row["advice"] = TECHNIQUES.get(advice.technique, "does not fit")
            rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]], gpu_gb: float, headroom: float = DEFAULT_HEADROOM) -> str:
    """The rows as a markdown table; GPU figures over the budget are marked."""
    budget = gpu_gb * (1 - headroom)
    gpu_columns = set(TECHNIQUES.values())

    def cell(column: str, value: Any) -> str:
        if isinstance(value, float):
            text = f"{value:.2f}" if column.endswith("(B)") else f"{value:,.1f}"
            return text + (" ✗" if column in gpu_columns and value > budget else "")
        return str(value)

    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(c, row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


# The README's figures: this command's table, between these markers (tests/test_memory_plan.py holds them
# equal; `python -m helpers.memory_plan --write-readme` rewrites them)
README_ARGS = ("--models", "all", "--modes", "full,lora", "--techniques", "ddp,fsdp,zero3_offload", "--brief")
README_MARKERS = ("<!-- technique-figures -->", "<!-- /technique-figures -->")

BRIEF_DROPS = ("parameters (B)", "trainable (M)", "offload CPU, all ranks")


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = list(known) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"--{what} {text!r}: use 'all' or a comma-separated list of {', '.join(known)}.")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m helpers.memory_plan",
        description="Per-GPU memory of model state (parameters, gradients, optimizer state; bf16 mixed "
                    "precision, AdamW) for each technique and way of training the published models, counted "
                    "on the meta device. Prints a markdown table in GB (1e9 bytes); ✗ marks a figure over "
                    "the budget (the GPU's memory less the headroom kept for activations).",
        epilog="example: python -m helpers.memory_plan --models gpt-oss-20b,gpt-oss-120b --gpus 8 "
               "--gpu-gb 80")
    parser.add_argument("--models", default="all",
                        help=f"'all' or a comma-separated list of {', '.join(REAL_MODELS)}")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs (processes) to train on (default 8)")
    parser.add_argument("--gpu-gb", type=float, default=80.0, help="memory of each GPU in GB (default 80)")
    parser.add_argument("--modes", default="all",
                        help=f"'all' or a comma-separated list of {', '.join(MODES)}")
    parser.add_argument("--optimizer", default="adamw", choices=list(OPTIMIZER_STATE_BYTES))
    parser.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                        help=f"share of each GPU kept for activations (default {DEFAULT_HEADROOM})")
    parser.add_argument("--techniques", default="all",
                        help=f"'all' or a comma-separated list of {', '.join(TECHNIQUES)}")
    parser.add_argument("--brief", action="store_true",
                        help="the GB columns and the advice only (no sizes, no offload CPU column)")
    parser.add_argument("--write-readme", action="store_true",
                        help="write the README's table (its own options: " + " ".join(README_ARGS) + ")")
    parser.add_argument("--cpu-gb", type=float, default=None,
                        help="CPU memory of the machine in GB: advise offload only where it fits "
                             "(default: not checked)")
    args = parser.parse_args(argv)
    if args.write_readme:
        return write_readme()
    from helpers.logs import drop_import_notices

    drop_import_notices()  # transformers' and peft's dependencies announce kernels a count never uses
    try:
        models = _names(args.models, list(REAL_MODELS), "models")
        modes = _names(args.modes, list(MODES), "modes")
        if args.gpus < 1:
            raise ValueError(f"--gpus {args.gpus}: give the number of GPUs, 1 or more.")
        techniques = _names(args.techniques, list(TECHNIQUES), "techniques")
        rows = technique_table(models, args.gpus, args.gpu_gb, modes, techniques, optimizer=args.optimizer,
                               headroom=args.headroom, cpu_gb=args.cpu_gb)
    except ValueError as e:
        parser.error(str(e))
    if args.brief:
        rows = [{k: v for k, v in row.items() if k not in BRIEF_DROPS} for row in rows]
    budget = args.gpu_gb * (1 - args.headroom)
    print(f"Model state per GPU, GB, on {args.gpus} GPUs of {args.gpu_gb:g} GB ({args.optimizer}, bf16 "
          f"mixed precision; ✗: over {budget:.1f} GB, what a GPU keeps beside {args.headroom:.0%} for "
          "activations):\n")
    print(markdown_table(rows, args.gpu_gb, args.headroom))
    return 0


def readme_table() -> str:
    """The table `python -m helpers.memory_plan` prints with README_ARGS."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(list(README_ARGS))
    return out.getvalue().split("\n\n", 1)[1].strip()


def write_readme(readme: Path | None = None) -> int:
    from helpers.paths import ROOT

    readme = readme or ROOT / "README.md"
    start, end = README_MARKERS
    text = readme.read_text()
    if text.count(start) != 1 or text.count(end) != 1:
        raise SystemExit(f"{readme}: expected one {start} and one {end} around the table; put them back "
                         "first.")
    head, rest = text.split(start)
    readme.write_text(f"{head}{start}\n{readme_table()}\n{end}{rest.split(end, 1)[1]}")
    print(f"wrote the model-state table into {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
