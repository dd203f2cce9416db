"""A saved GPT-OSS model folder in the MXFP4 layout OpenAI ships, built offline and tiny.

Why: `openai/gpt-oss-20b` and `-120b` are published with their expert weights quantized to MXFP4: each
`mlp.experts.gate_up_proj` / `down_proj` is stored as `*_blocks` (uint8, two 4-bit values a byte, 32 values a
block) and `*_scales` (uint8, one power-of-two exponent a block, biased by 127), and `config.json` says
`"quantization_config": {"quant_method": "mxfp4", ...}`. Fine-tuning such a checkpoint in transformers means
loading it with `Mxfp4Config(dequantize=True)` (bf16 weights a trainer can update), and that path can only be
tested offline on a folder with the same layout. This module writes one: a `GptOssForCausalLM` of any small
shape, its experts quantized exactly as the real files are, with the gallery's character tokenizer.

    folder = build_gpt_oss_checkpoint(tmp / "gpt-oss-tiny", mxfp4=True)
    AutoModelForCausalLM.from_pretrained(folder, quantization_config=Mxfp4Config(dequantize=True))

The notebook (07) builds its own tiny model in plain bf16/fp32 layout where the reader sees it; this is only
the stand-in for the downloaded checkpoint. Beside it, what notebook 07 calls on any GPT-OSS checkpoint:
`load_options` (the `from_pretrained` keywords: eager attention, MXFP4 dequantized only where the checkpoint
has it), `moe_sizes` (a mixture of experts counted on the meta device) and `check_lora_targets` (a LoRA
configuration applied on the meta device: refused when a target matches nothing, counted otherwise, and a
warning when FSDP without gradient checkpointing would keep every layer's merged expert weights:
`check_expert_lora_memory`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from helpers.data.builds import reuse_or_build
from helpers.paths import cache_dir

# The 16 values a 4-bit MXFP4 (E2M1) code stands for: sign bit 8, then 0, 0.5, 1, 1.5, 2, 3, 4, 6
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # values per scale
# What OpenAI's configs leave in bf16 (transformers reads this list)
MODULES_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                         "lm_head"]
_FORMAT_VERSION = 1


def quantize_mxfp4(weight):
    """(blocks, scales) of an expert weight `[experts, in, out]`, in the layout of the published files.

    Blocks are `[experts, out, in / 32, 16]` uint8 (low nibble first), scales `[experts, out, in / 32]` uint8:
    per block of 32 inputs, the exponent e that brings the block's largest magnitude to at most 6 (FP4's
    largest value), stored as e + 127; each value is rounded to the nearest FP4 value times 2**e.
    """
    import torch

    experts, n_in, n_out = weight.shape
    if n_in % BLOCK:
        raise ValueError(f"MXFP4 packs {BLOCK} values a block: the input size {n_in} must be a multiple "
                         f"of {BLOCK}")
    w = weight.detach().float().transpose(1, 2).reshape(experts, n_out, n_in // BLOCK, BLOCK)
    peak = w.abs().amax(dim=-1).clamp_min(2.0**-126)
    exponent = torch.ceil(torch.log2(peak / 6.0)).clamp(-127, 127)
    scaled = w / torch.exp2(exponent)[..., None]
    values = torch.tensor(FP4_VALUES[:8])
    code = (scaled.abs()[..., None] - values).abs().argmin(dim=-1)          # nearest magnitude, 0..7
    code = code | ((scaled < 0) & (code > 0)).to(code.dtype) << 3           # sign bit
    code = code.to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)                        # two values a byte, low first
    scales = (exponent + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def save_mxfp4(model, folder: str | Path) -> None:
    """Write a `GptOssForCausalLM` as OpenAI ships it: experts as MXFP4 blocks and scales, the rest bf16."""
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            tensors[name + "_blocks"], tensors[name + "_scales"] = quantize_mxfp4(tensor)
        else:
            tensors[name] = tensor.detach().to(torch.bfloat16).contiguous()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": MODULES_NOT_CONVERTED}
    config["torch_dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def build_gpt_oss_checkpoint(root: str | Path | None = None, *, mxfp4: bool = True, hidden_size: int = 64,
                             layers: int = 2, experts: int = 4, experts_per_token: int = 2,
                             sliding_window: int = 8, seed: int = 0) -> Path:
    """Write (or reuse) a tiny GPT-OSS folder and return it: `config.json`, `model.safetensors`, tokenizer.

    The architecture's real options at a small size: alternating sliding/full attention, attention sinks,
    grouped-query attention, top-k routing over `experts` experts, untied embeddings. `mxfp4=True` stores the
    experts as the published checkpoints do; `False`, as `save_pretrained` does.
    """
    if hidden_size % 32:
        raise ValueError(f"hidden_size={hidden_size}: MXFP4 blocks hold 32 values; use a multiple of 32.")
    args = {"mxfp4": mxfp4, "hidden_size": hidden_size, "layers": layers, "experts": experts,
            "experts_per_token": experts_per_token, "sliding_window": sliding_window, "seed": seed,
            "version": _FORMAT_VERSION}
    folder = Path(root) if root is not None else cache_dir(
        "gpt_oss_checkpoint", f"{'mxfp4' if mxfp4 else 'fp32'}-h{hidden_size}-l{layers}-e{experts}-s{seed}")
    names = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    files = [folder / n for n in names]

    def write() -> None:
        _write_model(folder, "mxfp4" if mxfp4 else "fp32", hidden_size=hidden_size, layers=layers,
                     experts=experts, experts_per_token=experts_per_token, sliding_window=sliding_window,
                     seed=seed)

    reuse_or_build(folder, args, files, write)
    return folder


def build_gpt_oss_bf16(root: str | Path | None = None, *, hidden_size: int = 512, layers: int = 8,
                       experts: int = 8, experts_per_token: int = 2, sliding_window: int = 8,
                       seed: int = 0) -> Path:
    """Write (or reuse) a GPT-OSS folder of any size as plain bf16 safetensors, with the character tokenizer.

    The same architecture and options as `build_gpt_oss_checkpoint`, but built in bf16 from the start (the
    process holds one bf16 copy, never an fp32 one) and saved as `save_pretrained` does, in shards of at most
    2 GB: the layout of a model a user fine-tuned and saved, at the size the memory benchmark needs
    (benchmarks/llm_memory.py: about 1.5 GB).
    """
    args = {"hidden_size": hidden_size, "layers": layers, "experts": experts,
            "experts_per_token": experts_per_token, "sliding_window": sliding_window, "seed": seed,
            "version": _FORMAT_VERSION}
    folder = Path(root) if root is not None else cache_dir(
        "gpt_oss_checkpoint", f"bf16-h{hidden_size}-l{layers}-e{experts}-k{experts_per_token}-s{seed}")
    names = ("config.json", "tokenizer.json", "tokenizer_config.json")

    def write() -> None:
        _write_model(folder, "bf16", hidden_size=hidden_size, layers=layers, experts=experts,
                     experts_per_token=experts_per_token, sliding_window=sliding_window, seed=seed)

    reuse_or_build(folder, args, [folder / n for n in names], write)
    return folder


def _write_model(folder: Path, layout: str, *, hidden_size: int, layers: int, experts: int,
                 experts_per_token: int, sliding_window: int, seed: int) -> None:
    """Build a seeded `GptOssForCausalLM` of this module's config and save it with the character tokenizer.

    `layout`: "mxfp4" (experts quantized as the published files), "fp32" (`save_pretrained` of the model as
    built) or "bf16" (built in bf16 from the start, so the process never holds an fp32 copy, and saved in
    shards of at most 2 GB)."""
    import torch
    from transformers import GptOssForCausalLM

    from helpers.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = gpt_oss_config(len(tokenizer), tokenizer, hidden_size=hidden_size, layers=layers,
                            experts=experts, experts_per_token=experts_per_token,
                            sliding_window=sliding_window)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    if layout == "bf16":
        torch.set_default_dtype(torch.bfloat16)
    try:
        model = GptOssForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    if layout == "mxfp4":
        save_mxfp4(model, folder)
    else:
        model.save_pretrained(folder, **({"max_shard_size": "2GB"} if layout == "bf16" else {}))
    del model
    tokenizer.save_pretrained(folder)


def gpt_oss_config(vocab_size: int, tokenizer=None, *, hidden_size: int, layers: int, experts: int,
                   experts_per_token: int = 2, sliding_window: int = 8):
    """The `GptOssConfig` of this module's checkpoints (head_dim 16, intermediate size = hidden size)."""
    from transformers import GptOssConfig

    return GptOssConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size, head_dim=16,
        num_attention_heads=hidden_size // 16, num_key_value_heads=max(1, hidden_size // 32),
        num_hidden_layers=layers, num_local_experts=experts, num_experts_per_tok=experts_per_token,
        sliding_window=sliding_window, max_position_embeddings=256, rope_scaling=None,
        tie_word_embeddings=False, pad_token_id=None if tokenizer is None else tokenizer.pad_token_id,
        eos_token_id=None if tokenizer is None else tokenizer.eos_token_id, bos_token_id=None)


def load_options(path: str, dtype: Any = None) -> dict[str, Any]:
    """`from_pretrained` keyword arguments for a GPT-OSS checkpoint (a folder or a hub id).

    GPT-OSS is trained with `attn_implementation="eager"` (its attention sinks are not in PyTorch's fused SDPA
    kernel). The published checkpoints store their experts in MXFP4, which a trainer cannot update:
    `Mxfp4Config(dequantize=True)` unpacks them to bf16 while loading. It is passed only when the checkpoint's
    config says `quant_method: mxfp4`: given to an ordinary checkpoint, transformers refuses to load it.
    """
    from transformers import AutoConfig

    options = {"attn_implementation": "eager", "dtype": dtype}
    quantization = getattr(AutoConfig.from_pretrained(path), "quantization_config", None) or {}
    if not isinstance(quantization, dict):
        quantization = quantization.to_dict()
    if quantization.get("quant_method") == "mxfp4":
        from transformers import Mxfp4Config

        options["quantization_config"] = Mxfp4Config(dequantize=True)   # MXFP4 experts -> bf16 weights
    return options


def moe_sizes(configs: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per named config, built on the `meta` device (nothing allocated, whatever its size): its parameters,
    those in the experts, those one token computes with (every expert's share but the top-k's left out), its
    layers, experts and top-k."""
    import torch
    from transformers import AutoModelForCausalLM

    sizes = {}
    for name, config in configs.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        total = sum(p.numel() for p in model.parameters())
        expert = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
        active = total - expert + expert * config.num_experts_per_tok // config.num_local_experts
        sizes[name] = {"parameters": total, "in experts": expert, "active per token": active,
                       "layers": config.num_hidden_layers, "experts": config.num_local_experts,
                       "top-k": config.num_experts_per_tok}
    return sizes


class LoraTargets(dict):
    """What a LoRA configuration trains on a model: `trainable` and `total` parameters, what it `adapted`."""

    def __str__(self) -> str:
        return (f"{self['trainable']:,} trainable parameters of {self['total']:,} "
                f"({100 * self['trainable'] / self['total']:.2f}%), adapting {self['adapted']}")


def check_lora_targets(config: Any, lora: Any, *, strategy: str | None = None, plan: Any = None,
                       checkpointing: bool = True) -> LoraTargets:
    """Apply `lora` (a peft `LoraConfig`) to the model of `config` on the `meta` device and say what it
    trains: `trainable` and `total` parameters, and the names of what it `adapted`. A target that matches
    nothing fails here, with the names that exist, rather than inside the ranks (peft itself only fails when
    no target at all matches).

    Given the `strategy`, the launch `plan` (its device and processes) and whether gradient `checkpointing`
    is on, it also warns, before anything is loaded, when FSDP with LoRA on the experts would keep more
    merged expert weights than a process can spare (`check_expert_lora_memory`)."""
    import re

    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if plan is not None:
        memory, value_bytes = process_memory(plan.device, plan.processes)
        check_expert_lora_memory(model, lora, strategy=strategy, checkpointing=checkpointing,
                                 memory_bytes=memory, bytes_per_value=value_bytes)
    names = [n for n, _ in model.named_parameters()]
    for target in lora.target_parameters or []:
        if not any(n == target or n.endswith("." + target) for n in names):
            raise ValueError(f"lora_target_parameters: {target!r} matches no parameter of this model; expert "
                             f"weights are named like {[n for n in names if '.experts.' in n][:2]}")
    modules = [n for n, _ in model.named_modules()]
    wanted = lora.target_modules
    hint = "use 'all-linear' or module names such as ['q_proj', 'v_proj']."
    if wanted != "all-linear" and wanted is not None:
        pattern = isinstance(wanted, str)   # peft: a string is a regular expression, a list holds names
        shown = wanted if pattern else sorted(wanted)
        for target in [wanted] if pattern else shown:
            if not any(re.fullmatch(target, n) if pattern else (n == target or n.endswith("." + target))
                       for n in modules):
                raise ValueError(f"lora_target_modules={shown!r} matches nothing in this model ({target!r}); "
                                 + hint)
    try:
        with torch.device("meta"):   # the adapters too: nothing allocated, whatever the model's size
            adapted_model = get_peft_model(model, lora)
    except ValueError as e:   # a target_modules entry that matches no module
        raise ValueError(f"lora_target_modules={wanted!r} matches nothing in this model ({e}); "
                         + hint) from None
    return LoraTargets(
        trainable=sum(p.numel() for p in adapted_model.parameters() if p.requires_grad),
        total=sum(p.numel() for p in adapted_model.parameters()),
        # what was adapted: a module's name, or for the experts the parameter it wraps
        adapted=sorted({getattr(m, "parameter_name", None) or n.split(".")[-1]
                        for n, m in adapted_model.named_modules() if hasattr(m, "lora_A")}))


# LoRA on the experts under FSDP without gradient checkpointing: autograd keeps every layer's merged expert
# weights (W + B A, built in the forward pass) until that layer's backward pass, so a rank holds them for all
# layers at once, whatever N. Above this share of what a process has, the settings check warns.
EXPERT_MEMORY_SHARE = 0.25


class ExpertLoraMemoryWarning(UserWarning):
    """FSDP + LoRA on the experts without gradient checkpointing would hold every layer's merged experts."""


def process_memory(device: str, processes: int) -> tuple[int | None, int]:
    """(bytes one process has, bytes a trained value takes there): on CPU the host's RAM over the processes
    that share it, at fp32; on GPUs the smallest GPU's memory (nvidia-smi: asking torch would open a CUDA
    context in the notebook's kernel), at bf16. None where that memory cannot be read."""
    if device != "cuda":
        import psutil

        return psutil.virtual_memory().total // max(1, processes), 4
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, 2
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return min(int(line) for line in out.split()) * 2**20, 2   # MiB
    except (OSError, ValueError, subprocess.SubprocessError):
        return None, 2


def merged_expert_bytes(model: Any, lora: Any, bytes_per_value: int = 4) -> int:
    """The bytes of every expert weight `lora.target_parameters` adapts, all layers: what autograd keeps of
    LoRA on the experts (the merged `W + B A` of each) until the backward pass when no layer is recomputed.
    `model`: a model (on the meta device) or its config."""
    if not getattr(lora, "target_parameters", None):
        return 0
    if not hasattr(model, "named_parameters"):
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model)
    targets = list(lora.target_parameters)
    return bytes_per_value * sum(p.numel() for n, p in model.named_parameters()
                                 if any(n == t or n.endswith("." + t) for t in targets))


def check_expert_lora_memory(model: Any, lora: Any, *, strategy: str | None, checkpointing: bool,
                             memory_bytes: int | None, bytes_per_value: int = 4) -> str | None:
    """Warn (`ExpertLoraMemoryWarning`) when FSDP with LoRA on the experts and gradient checkpointing off
    would keep more merged expert weights (all layers, `merged_expert_bytes`) than EXPERT_MEMORY_SHARE of
    `memory_bytes`, the memory one process has; return the warning, or None when quiet.

    Why: FSDP shards the experts, but PEFT's LoRA on them builds each layer's merged weight `W + B A` in the
    forward pass and autograd keeps it for that layer's backward pass. With checkpointing off every layer's
    is kept at once, so each rank holds about the model's expert weights on top of its shard (measured by
    benchmarks/llm_memory.py); with it on, only the layer being recomputed."""
    if strategy != "fsdp" or checkpointing or memory_bytes is None:
        return None
    merged = merged_expert_bytes(model, lora, bytes_per_value)
    if merged <= EXPERT_MEMORY_SHARE * memory_bytes:
        return None
    message = (f"strategy='fsdp' with LoRA on the experts and gradient checkpointing off: every rank keeps "
               f"every layer's merged expert weights (W + B A) for the backward pass, {merged / 1e9:.1f} GB, "
               f"more than {EXPERT_MEMORY_SHARE:.0%} of the {memory_bytes / 1e9:.1f} GB a process has; "
               "FSDP's sharding saves nothing on them. Run with -p gradient_checkpointing True (only the "
               "layer being recomputed is then kept).")
    import warnings

    warnings.warn(message, ExpertLoraMemoryWarning, stacklevel=3)
    return message
