"""The model's tensors under FSDP2 in TRL's trainer: loaded by rank 0 alone and sent to the others as shards
(`ShardsFromRank0`), a rank's shard and the whole value of a sharded tensor, what the trainer sharded
(`sharding_summary`), and the trained model saved as `from_pretrained` reads it, one tensor at a time.

Why: a 120B model fits no single process whole, so loading and saving go one tensor at a time, and the
checks need to see that FSDP really sharded the model.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

# tqdm's notebook check, run when transformers is first imported: progress bars come from helpers
warnings.filterwarnings("ignore", message="IProgress not found")

from transformers import TrainerCallback  # noqa: E402

M_MMAP_THRESHOLD = -3   # glibc's mallopt parameter number (malloc.h)


def release_freed_memory() -> None:
    """On a CPU rank that receives its shards by broadcast: return every freed buffer of 1 MiB or more to the
    system at once.

    The whole-tensor buffers rank 0 broadcasts into are host memory on CPU ranks, one after the other. glibc
    keeps freed memory in its heap for reuse, and its threshold for that grows with what is freed, so a rank's
    resident memory would reach the whole model. A fixed mmap threshold of 1 MiB (`mallopt(M_MMAP_THRESHOLD)`)
    returns each buffer when it is freed. GPU ranks receive into GPU memory and need nothing. Only on Linux
    with glibc; elsewhere nothing is done.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or "libc" not in name:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).mallopt(M_MMAP_THRESHOLD, 1 << 20)


class ShardsFromRank0(TrainerCallback):
    """FSDP's RAM-efficient loading, the FSDP2 way: rank 0 alone reads the checkpoint; every other rank builds
    the model empty and receives only its shards, once the trainer has sharded the model. Under FSDP on
    several ranks (`fsdp` and more than one rank; otherwise every rank simply loads the checkpoint):

    * `from_pretrained(path, dtype)` gives each rank its model. Rank 0 loads the checkpoint with
      `helpers.models.gpt_oss.load_options`. Every other rank builds the same model from its config on the
      `meta` device and gives each parameter storage that is never written, so never resident (`fully_shard`
      keeps only the rank's slice of it; each parameter gets its own address, by which accelerate maps the
      optimizer's parameters to their shards); buffers such as the rotary frequencies are computed, as
      transformers does. The config is read without its quantization: rank 0 dequantizes MXFP4 experts, the
      others hold plain weights. Every rank's model has one dtype, `dtype` (or torch's default), so that its
      slices match rank 0's (dequantized MXFP4 experts come out in bf16 whatever dtype asks).
    * As a callback (first among the trainer's, so that the others see the loaded weights): rank 0 keeps its
      whole model (LoRA adapters included) when the trainer is built; once the trainer has sharded the model,
      each tensor is broadcast from rank 0 and every rank copies in its own slice
      (`set_model_state_dict(..., broadcast_from_rank0=True)`); then rank 0 lets go of the whole model.

    accelerate's `fsdp_cpu_ram_efficient_loading` does the same with the model before sharding: it holds a
    rank's shards twice for a moment (the broadcast slices and FSDP's own copy of them), and transformers'
    side of it leaves quantized checkpoints out (every rank would dequantize the whole model).
    """

    def __init__(self, fsdp: bool) -> None:
        from helpers.context import worker_context

        ctx = worker_context()
        self.enabled, self.is_main, self.device = fsdp and ctx.world_size > 1, ctx.is_main, ctx.device
        self.full_state: dict[str, Any] = {}

    def from_pretrained(self, path: str, dtype: Any = None) -> Any:
        """This rank's model (see the class docstring)."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from helpers.models.gpt_oss import load_options

        if self.enabled and self.device == "cpu":
            release_freed_memory()   # the broadcast's whole-tensor buffers are host memory here
        if self.enabled and not self.is_main:
            from accelerate import init_empty_weights

            config = AutoConfig.from_pretrained(path)
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            with init_empty_weights(include_buffers=False):
                model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=dtype)
            for name, param in list(model.named_parameters()):
                owner, _, attr = name.rpartition(".")
                setattr(model.get_submodule(owner), attr, torch.nn.Parameter(
                    torch.empty_like(param, device="cpu"), requires_grad=param.requires_grad))
            return model
        model = AutoModelForCausalLM.from_pretrained(path, **load_options(path, dtype))
        if self.enabled:
            model.to(dtype or torch.get_default_dtype())
        return model

    def on_init_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.enabled and state.is_world_process_zero:
            self.full_state = dict(model.state_dict())

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if self.enabled:
            set_model_state_dict(model, self.full_state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
            self.full_state = {}


def local_shard(tensor: Any) -> Any:
    """A DTensor's local shard (under FSDP), or the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def full_value(param: Any) -> Any:
    """A parameter's whole value, detached (under FSDP gathered from the shards: every rank must call it)."""
    return (param.full_tensor() if hasattr(param, "full_tensor") else param).detach().clone()


def save_trained(trainer: Any, folder: str, tokenizer: Any) -> None:
    """The fine-tuned model in `folder`, as `from_pretrained` (or PEFT's, for an adapter) reads it; every rank
    must call it (under FSDP each gather is a collective), rank 0 writes.

    LoRA: the adapter alone, gathered tensor by tensor, whole on rank 0 (it is small: a few hundred MB for the
    120B model). Full fine-tuning: the whole model streamed, one gathered tensor at a time, into safetensors
    files of at most 1 GiB that rank 0 writes as they fill (`save_streamed`), so no process holds the whole
    model; then the config for generation (no load-balancing loss, the KV cache on, no quantization: MXFP4
    experts were dequantized) and the generation config. TRL's own save under FSDP writes a sharded state dict
    in DCP's format, which `from_pretrained` does not read.
    """
    import copy

    from peft import PeftModel

    from helpers.integrations.transformers import save_streamed

    model, is_main = trainer.model, trainer.accelerator.is_main_process
    if isinstance(model, PeftModel):
        adapter = {}
        for name, tensor in model.state_dict().items():
            if "lora_" in name:
                tensor = full_value(tensor).cpu()
                if is_main:
                    adapter[name] = tensor
        if is_main:
            model.save_pretrained(folder, state_dict=adapter)
    else:
        save_streamed(((name, full_value(tensor).cpu()) for name, tensor in model.state_dict().items()),
                      folder, is_main)
        if is_main:
            inference = copy.deepcopy(model.config)
            inference.update({"output_router_logits": False, "use_cache": True})
            if hasattr(inference, "quantization_config"):
                del inference.quantization_config
            inference.save_pretrained(folder)
            model.generation_config.save_pretrained(folder)
    if is_main:
        tokenizer.save_pretrained(folder)
    trainer.accelerator.wait_for_everyone()


def sharding_summary(model: Any) -> dict[str, Any]:
    """How the trainer wrapped the model: its wrapper, the module classes `fully_shard` wrapped, how many of
    its parameters are DTensors (sharded) and the first few that are not, and the elements this rank holds."""
    from torch.distributed.fsdp import FSDPModule

    params = list(model.named_parameters())
    return {
        "wrapper": type(model).__name__,
        "fsdp_modules": sorted({type(m).__name__.replace("FSDP", "", 1) for m in model.modules()
                                if isinstance(m, FSDPModule)}),
        "dtensor_params": sum(type(p).__name__ == "DTensor" for _, p in params), "params": len(params),
        "whole_params": [n for n, p in params if type(p).__name__ != "DTensor"][:4],
        "local_param_elements": sum(local_shard(p).numel() for _, p in params),
    }
