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
PRESETS = {"tiny": dict(hidden_size=128, layers=2, n_heads=4, context=64),
           "10M": dict(hidden_size=384, layers=6, n_heads=6, context=256)}


@dataclass
class GPTConfig:
    hidden_size: int   # the width of every token's vector
    layers: int        # the number of transformer blocks
    n_heads: int
    context: int
    vocab_size: int = VOCAB_SIZE


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_heads = c.n_heads
        self.norm1, self.norm2 = nn.LayerNorm(c.hidden_size), nn.LayerNorm(c.hidden_size)
        self.qkv = nn.Linear(c.hidden_size, 3 * c.hidden_size, bias=False)
        self.attn_out = nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        self.mlp_in = nn.Linear(c.hidden_size, 4 * c.hidden_size, bias=False)
        self.mlp_out = nn.Linear(4 * c.hidden_size, c.hidden_size, bias=False)

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
        self.tok_emb = nn.Embedding(c.vocab_size, c.hidden_size)
        self.pos_emb = nn.Embedding(c.context, c.hidden_size)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.hidden_size)
        self.head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

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
    residual_std = 0.02 / math.sqrt(2 * model.config.layers)   # the layers that add into the residual
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
    """The preset's configuration with the given fields replaced (None keeps the preset's value).

    The notebooks pass their parameters as they are, so a bad one is refused here, before anything is built:
    a preset that does not exist, a size that is not a whole number of at least 1, a width that the heads
    do not divide.
    """
    from helpers.settings import check_whole

    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not one of {', '.join(map(repr, PRESETS))}.")
    chosen = dict(PRESETS[preset])
    unknown = set(overrides) - set(chosen)
    if unknown:
        raise TypeError(f"unknown GPT configuration field(s) {sorted(unknown)}; known: {sorted(chosen)}")
    for name, value in overrides.items():
        if value is not None:
            check_whole(name, value, hint=f", or None for the {preset!r} preset's {chosen[name]}")
            chosen[name] = value
    if chosen["hidden_size"] % chosen["n_heads"]:
        raise ValueError(f"hidden_size={chosen['hidden_size']} must be a multiple of "
                         f"n_heads={chosen['n_heads']}.")
    return GPTConfig(**chosen)


def model_source() -> str:
    """The model's code as the notebooks print it: the configuration, the two modules and the init."""
    module = sys.modules[__name__]
    return "\n\n\n".join(inspect.getsource(getattr(module, name)).rstrip()
                       for name in ("GPTConfig", "Block", "GPT", "init_weights"))


@torch.no_grad()
def validation_loss(model: nn.Module, tokens, cfg: dict, device: torch.device | str) -> float:
    """The mean validation loss (nats per byte) over `cfg["eval_batches"]` fixed global batches of `tokens`,
    shared out between the ranks: each rank scores its slice of each batch on `device`, and the sums are
    all-reduced.

    The batches are `global_batch(tokens, -1 - i, cfg)`: the same windows at every evaluation and for any
    number of ranks, so the curve is comparable across runs. Called by every rank (collective).
    """
    import torch.distributed as dist

    from helpers.data.text_corpus import global_batch

    rank, world_size = dist.get_rank(), dist.get_world_size()
    local = cfg["batch_size"] // world_size
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for i in range(cfg["eval_batches"]):
        batch = global_batch(tokens, -1 - i, cfg)[rank * local:(rank + 1) * local].to(device)
        logits = model(batch[:, :-1]).float()
        total[0] += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum")
        total[1] += batch[:, 1:].numel()
    dist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()
