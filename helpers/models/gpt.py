"""The gallery's small byte-level GPT, shared by the lessons that train it (04 FSDP, 10 fast and elastic).

Why a module and not a notebook cell: two lessons train this exact model, and a copy in each would drift
(one fixed, the other not), while the lessons' comparisons (FSDP against DDP, a resumed run against an
uninterrupted one) only mean something if the model is the same. It stays short enough to read in one
sitting, and the notebooks print it where they use it (`print(model_source())`).

`init_weights` is written for FSDP: build the model on the `meta` device, shard it, `to_empty`, then
initialise in place. Every weight is drawn in full from one seeded generator and each rank keeps its own
shard, so the weights are the same for any number of processes, sharded or not.
"""

from __future__ import annotations

import inspect
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers.data.text_corpus import VOCAB_SIZE

# "tiny" trains on a 2-core CPU in a minute; "10M" is the ~10M-parameter model for GPUs
PRESETS = {"tiny": dict(d_model=128, n_layers=2, n_heads=4, context=64),
           "10M": dict(d_model=384, n_layers=6, n_heads=6, context=256)}


@dataclass
class GPTConfig:
    d_model: int
    n_layers: int
    n_heads: int
    context: int
    vocab_size: int = VOCAB_SIZE


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_heads = c.n_heads
        self.norm1, self.norm2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model, bias=False)
        self.attn_out = nn.Linear(c.d_model, c.d_model, bias=False)
        self.mlp_in = nn.Linear(c.d_model, 4 * c.d_model, bias=False)
        self.mlp_out = nn.Linear(4 * c.d_model, c.d_model, bias=False)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(attn.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp_out(F.gelu(self.mlp_in(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig, activation_checkpointing: bool = False):
        super().__init__()
        self.config, self.activation_checkpointing = c, activation_checkpointing
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = nn.Embedding(c.context, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def forward(self, idx):
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            if self.activation_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))


@torch.no_grad()
def init_weights(model: nn.Module, seed: int) -> None:
    """GPT-2 style init, drawn in full from one generator; each rank keeps its own shard."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    generator = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * model.config.n_layers)   # the layers that add into the residual
    for name, param in model.named_parameters():             # the same order on every rank
        if name.startswith("norm") or ".norm" in name:
            full = torch.ones(param.shape) if name.endswith("weight") else torch.zeros(param.shape)
        else:
            std = residual_std if name.endswith(("attn_out.weight", "mlp_out.weight")) else 0.02
            full = torch.randn(param.shape, generator=generator) * std
        if isinstance(param, DTensor):   # sharded by FSDP: keep this rank's slice
            full = distribute_tensor(full.to(param.device), param.device_mesh, param.placements)
        param.copy_(full)


def gpt_config(preset: str = "tiny", **overrides: int | None) -> GPTConfig:
    """The preset's configuration with the given fields replaced (None keeps the preset's value)."""
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not one of {', '.join(map(repr, PRESETS))}.")
    chosen = dict(PRESETS[preset])
    unknown = set(overrides) - set(chosen)
    if unknown:
        raise TypeError(f"unknown GPT configuration field(s) {sorted(unknown)}; known: {sorted(chosen)}")
    chosen.update({k: v for k, v in overrides.items() if v is not None})
    if chosen["d_model"] % chosen["n_heads"]:
        raise ValueError(f"d_model={chosen['d_model']} must be a multiple of n_heads={chosen['n_heads']}.")
    return GPTConfig(**chosen)


def model_source() -> str:
    """The model's code as the notebooks print it: the configuration, the two modules and the init."""
    module = sys.modules[__name__]
    return "\n\n\n".join(inspect.getsource(getattr(module, name)).rstrip()
                       for name in ("GPTConfig", "Block", "GPT", "init_weights"))
