"""A model counted on the meta device: its parameters, those trained, those QLoRA stores in 4 bits, and the
largest repeated block (what FSDP and ZeRO-3 gather at once), for `helpers.technique_plan` to turn into bytes.

Why: the counts come from the model itself, built from its configuration on the `meta` device (shapes, no
memory), with peft's own LoRA applied, so nothing is a typed-in parameter count and the 120B model counts in
seconds on a laptop.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from helpers.published_models import REAL_MODELS, real_model

MODES = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA (4-bit base)"}
# bitsandbytes NF4 as QLoRA recipes load it (bnb_4bit_use_double_quant=True, blocksize 64): half a byte a
# weight, one uint8 absmax a block of 64, one fp32 scale a group of 256 blocks (tests/test_memory_plan.py
# quantizes a tensor with bitsandbytes and checks this)
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
BF16_BYTES = 2


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


@functools.cache
def _real_counts(name: str, lora: bool) -> ParamCounts:
    model = real_model(name)
    return count_parameters(model.config(), model.lora() if lora else None, name=name)


def count_real_model(name: str, mode: str = "full") -> ParamCounts:
    """The counts of a published model for one way of training it: "full", "lora" or "qlora"."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: use one of {', '.join(map(repr, MODES))}.")
    counts = _real_counts(name, mode != "full")
    return dataclasses.replace(counts, load_in_4bit=True) if mode == "qlora" else counts
