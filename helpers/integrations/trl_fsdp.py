"""TRL's SFTTrainer under FSDP2 as notebook 07 runs it: on GPUs or on CPU processes, several trainers in one
rank, the model loaded by rank 0 alone, and what the lesson measures of each run.

What is here, and why it is not in the notebook's recipe:

* `quiet_hugging_face()`: no progress bars, advisory warnings or tokenizer threads, in the kernel and its
  ranks;
* `set_accelerate_config(fsdp_config)`: the environment `accelerate launch --config_file fsdp2.yaml` gives a
  process, set inside a rank that the notebook's launcher started (and reset between the trainers a rank runs:
  accelerate keeps one state per process);
* `fsdp_on_cpu(trainer_class)`: on CPU processes accelerate treats the ranks as MULTI_CPU and silently drops
  the FSDP plugin (the run would be DDP); the trainer puts the same plugin back, so CPU ranks run the FSDP2
  code path GPUs run;
* `ShardsFromRank0`: rank 0 alone reads the checkpoint; every other rank builds the model empty and receives
  only its shards, once the trainer has sharded the model (FSDP2's own `set_model_state_dict(...,
  broadcast_from_rank0=True)`); on CPU ranks with `release_freed_memory()` (glibc's `mallopt`), so that the
  broadcast's whole-tensor buffers go back to the system;
* `NoBackwardPrefetch`: FSDP2 gathers one layer at a time in the backward pass, not the next one ahead too
  (accelerate has no option for it under FSDP2): a layer's memory more for the activations at 120B;
* the measurements, as `TrainerCallback`s with names: `StepMemory` (what a rank holds in one step, with
  torch's MemTracker), `RouterLoad` (the tokens the router sends to each expert), `AdapterUpdates` (LoRA: a
  gradient in every adapter matrix, moved expert adapters) and `HeldOutEvaluation` (the in-rank evaluation of
  `helpers.integrations.sft_eval`, before the first step and after the last, on the model as the ranks hold
  it);
* `save_trained(...)`: the fine-tuned model (or LoRA adapter) written as `from_pretrained` reads it, gathered
  one tensor at a time;
* for the kernel: `sharding_summary` (what the checks need to see that FSDP really sharded the model),
  `memory_table`, `plot_losses` and `plot_router_load`.

Importing it filters tqdm's "IProgress not found" warning, which importing transformers in a notebook without
ipywidgets would print (the gallery draws its own progress bars).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

# tqdm's notebook check, run when transformers is first imported: progress bars come from helpers
warnings.filterwarnings("ignore", message="IProgress not found")

from transformers import TrainerCallback  # noqa: E402

# accelerate launch writes the YAML's `fsdp_*` keys as FSDP_* variables; these two are named otherwise
_ENV_NAMES = {"fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP"}
M_MMAP_THRESHOLD = -3   # glibc's mallopt parameter number (malloc.h)


def quiet_hugging_face() -> None:
    """Quiet transformers, datasets and tokenizers in this process and in the ranks it launches afterwards
    (they inherit its environment when `preload` starts the launcher's forkserver: call it before).

    No progress bars (the gallery's own bar shows the steps), only transformers' errors (its advisory
    warnings are about defaults the recipe sets on purpose), no tokenizer thread pools (a process that used
    them and forks gets a warning per fork). Without a GPU, DeepSpeed (which transformers probes) is told to
    use its CPU accelerator rather than guess one and say so.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import torch

    if not torch.cuda.device_count():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def accelerate_environment(fsdp_config: Mapping[str, Any] | None) -> dict[str, str]:
    """The variables `accelerate launch` sets for an accelerate config file whose `fsdp_config` is this (its
    `fsdp_*` keys, as in TRL's `examples/accelerate_configs/fsdp2.yaml`); {} for None (no FSDP)."""
    if fsdp_config is None:
        return {}
    env = {"ACCELERATE_USE_FSDP": "true"}
    for key, value in fsdp_config.items():
        if not key.startswith("fsdp_"):
            raise ValueError(f"{key!r}: an accelerate fsdp_config key starts with 'fsdp_' (fsdp_version, "
                             "fsdp_reshard_after_forward, ...)")
        name = _ENV_NAMES.get(key, "FSDP_" + key.removeprefix("fsdp_").upper())
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        env[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def set_accelerate_config(fsdp_config: Mapping[str, Any] | None) -> None:
    """Inside a rank, before a trainer is built: the environment `accelerate launch --config_file` would have
    given this process for `fsdp_config` (None: plain DDP), replacing an earlier trainer's.

    accelerate keeps one state per process, made by the first `Accelerator`; a rank that runs several trainers
    (the parity runs under DDP and FSDP, then the fine-tuning run) forgets it here, so that the next trainer's
    accelerator is built from these settings.
    """
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    for key in [k for k in os.environ if k.startswith("FSDP_") or k == "ACCELERATE_USE_FSDP"]:
        del os.environ[key]
    os.environ.update(accelerate_environment(fsdp_config))


def fsdp_on_cpu(trainer_class: type) -> type:
    """`trainer_class` (transformers' Trainer, TRL's SFTTrainer) that runs FSDP on CPU processes too.

    With `use_cpu=True` accelerate makes the ranks MULTI_CPU and drops the FSDP plugin the environment asks
    for, silently: the run would be DDP. This trainer puts the same plugin back after the accelerator is
    created, so CPU ranks prepare the model with FSDP2's `fully_shard` as GPU ranks do. On GPUs it changes
    nothing.
    """

    class CpuFsdpTrainer(trainer_class):
        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            wanted = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
            if wanted and not self.is_fsdp_enabled:
                from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

                # the same plugin, from the FSDP_* settings
                self.accelerator.state.fsdp_plugin = FullyShardedDataParallelPlugin()
                self.accelerator.state.distributed_type = DistributedType.FSDP
                self.is_fsdp_enabled = True

    CpuFsdpTrainer.__name__ = CpuFsdpTrainer.__qualname__ = f"CpuFsdp{trainer_class.__name__}"
    return CpuFsdpTrainer


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


class NoBackwardPrefetch(TrainerCallback):
    """FSDP2 without backward prefetch: in the backward pass a rank gathers one decoder layer at a time.

    FSDP2 gathers the next layer while this one computes (overlap, at the cost of a second gathered layer in
    memory, which a 120B run needs for its activations), and accelerate has no option for it under FSDP2. Each
    FSDP module names itself as what to prefetch (already gathered: nothing is fetched)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_modules_to_backward_prefetch([module])


def _local(tensor: Any) -> Any:
    """A DTensor's local shard (under FSDP), or the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _nbytes(tensors: Any) -> int:
    return sum(_local(t).nbytes for t in tensors if t is not None)


def full_value(param: Any) -> Any:
    """A parameter's whole value, detached (under FSDP gathered from the shards: every rank must call it)."""
    return (param.full_tensor() if hasattr(param, "full_tensor") else param).detach().clone()


class StepMemory(TrainerCallback):
    """What this rank holds during training step `step` (0-based; None: no step measured).

    `held`: its model state, read from its live tensors just before the step's optimizer update (parameters,
    gradients and optimizer state; under FSDP its local shards). `peak`: the peak of everything it allocated
    during the whole step (forward, backward, optimizer step) by torch's MemTracker (torch.distributed._tools,
    the tool FSDP's own memory estimates come from), which follows every tensor as it is created and freed,
    per device. `cuda_peak_mb`: on GPUs, the CUDA allocator's peak over the run.
    """

    def __init__(self, step: int | None) -> None:
        self.step = step
        self.held: dict[str, int] | None = None
        self.peak: dict[str, int] | None = None
        self.cuda_peak_mb: float | None = None
        self._tracker: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                      **kwargs: Any) -> None:
        if state.global_step == self.step:
            self._tracker = _frozen_aware_tracker()
            self._tracker.track_external(model, getattr(optimizer, "optimizer", optimizer))
            self._tracker.__enter__()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                              optimizer: Any = None, **kwargs: Any) -> None:
        import torch

        if state.global_step != self.step:
            return
        params = list(model.parameters())
        moments = [t for s in getattr(optimizer, "optimizer", optimizer).state.values() for t in s.values()
                   if torch.is_tensor(t) and t.dim() > 0]
        self.held = {"parameters": _nbytes(params), "gradients": _nbytes(p.grad for p in params),
                     "optimizer state": _nbytes(moments)}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(None, None, None)
            peak = self._tracker.get_tracker_snapshot("peak")
            self.peak = {str(device): snapshot.get("Total", 0) for device, snapshot in peak.items()}
            self._tracker = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.cuda_peak_mb = torch.cuda.max_memory_allocated() / 2**20

    def result(self) -> dict[str, Any]:
        return {"held": self.held, "memory": self.peak, "cuda_peak_mb": self.cuda_peak_mb}


def _frozen_aware_tracker() -> Any:
    """torch's MemTracker, told that frozen parameters (LoRA's base weights) get no gradient: it hooks every
    parameter's gradient, which fails on one that cannot have any."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class FrozenAwareMemTracker(MemTracker):
        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            skip = (type("NoHook", (), {"remove": lambda self: None})(),) * 2
            for p in module.parameters():
                if not p.requires_grad:
                    self._param_to_grad_hook_handles.setdefault(p, skip)
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

    # its module tracker notes modules that autograd no longer references: nothing to act on
    warnings.filterwarnings("ignore", message="Module is None", category=UserWarning)
    return FrozenAwareMemTracker()


class RouterLoad(TrainerCallback):
    """The tokens the router of every mixture-of-experts layer sends to each expert, per training step.

    A forward hook on every router (`GptOssTopKRouter`) counts its top-k choices, padding excluded (a pre-hook
    on the input embeddings notes which tokens are padding), and not the second forward of a layer that
    gradient checkpointing recomputes in the backward pass. `counts()`: `[steps, layers, experts]`.
    """

    def __init__(self, model: Any, pad_token_id: int | None, router_class: str = "GptOssTopKRouter") -> None:
        import torch

        routers = [m for m in model.modules() if type(m).__name__ == router_class]
        if not routers:
            raise ValueError(f"the model has no {router_class}: nothing to count")
        embed = model.get_input_embeddings()
        self.pad_token_id, self.keep = pad_token_id, None
        self.current = torch.zeros(len(routers), routers[0].num_experts, dtype=torch.long)
        self.per_step: list[Any] = []
        embed.register_forward_pre_hook(self._note_padding)
        for layer, router in enumerate(routers):
            router.register_forward_hook(self._counter(layer))

    def _note_padding(self, module: Any, args: Any) -> None:
        self.keep = None if self.pad_token_id is None else (args[0] != self.pad_token_id).flatten()

    def _counter(self, layer: int) -> Any:
        import torch

        def count(module: Any, args: Any, output: Any) -> None:
            # only training forwards, and not a checkpointed layer's recomputation (run inside the backward)
            if torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
                indices = output[-1]   # the router returns (..., indices): [tokens, top_k]
                chosen = indices[self.keep] if self.keep is not None else indices
                self.current[layer] += torch.bincount(chosen.flatten().cpu(), minlength=self.current.shape[1])
        return count

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.per_step.append(self.current.clone())
        self.current.zero_()

    def counts(self) -> Any:
        """`[steps, layers, experts]` as a numpy array (None before the first step)."""
        import torch

        return torch.stack(self.per_step).numpy() if self.per_step else None


def plot_router_load(counts: Any, layer_types: list[str], most: int = 4, smooth: int = 10) -> Any:
    """The share of each layer's routed tokens each expert got, per step, smoothed over `smooth` steps: at
    most `most` layers drawn, spread over the depth. Returns the figure. `counts`: `[steps, layers,
    experts]`."""
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    n_layers, n_experts = counts.shape[1], counts.shape[2]
    shown = sorted(set(np.linspace(0, n_layers - 1, min(n_layers, most)).round().astype(int)))
    figure, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.2), squeeze=False)
    for layer, ax in zip(shown, axes[0], strict=True):
        share = pd.DataFrame(counts[:, layer, :] / counts[:, layer, :].sum(axis=1, keepdims=True))
        share = share.rolling(smooth, min_periods=1).mean()
        ax.stackplot(share.index + 1, share.T.values, labels=[f"expert {e}" for e in range(n_experts)])
        ax.set_ylim(0, 1)
        ax.set_xlabel("step")
        ax.set_ylabel("share of routed tokens")
        ax.set_title(f"layer {layer} ({layer_types[layer].replace('_', ' ')})")
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
    figure.tight_layout()
    return figure


def plot_losses(losses: Any, logs: Any, top_k: int, title: str) -> Any:
    """The training loss of every step (and its moving average over 25) beside the load-balancing loss the
    trainer logged (`aux_loss`, in `logs`: the trainer's log history), with the value a perfectly even router
    scores (`top_k`). Returns the figure."""
    import matplotlib.pyplot as plt

    figure, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
    ax.plot(losses.index + 1, losses.values, lw=0.8, label="per step")
    ax.plot(losses.index + 1, losses.rolling(25, min_periods=1).mean(), lw=2, label="moving average (25)")
    ax.set(xlabel="step", ylabel="loss (answer tokens + aux)", yscale="log", title=title)
    if "aux_loss" in logs:
        aux = logs.dropna(subset=["aux_loss"])
        ax2.plot(aux["step"], aux["aux_loss"], marker="o", ms=3)
    ax2.axhline(top_k, color="grey", ls=":", label="perfectly even router")
    ax2.set(xlabel="step", ylabel="load-balancing loss", title="auxiliary loss (rank 0)")
    ax.legend()
    ax2.legend()
    figure.tight_layout()
    return figure


class AdapterUpdates(TrainerCallback):
    """LoRA: the gradient each trainable matrix received (the sum of |grad| over the steps, this rank's part)
    and how far each expert adapter moved from where it started (its largest change, gathered whole).

    `lora_A` gets no gradient until `lora_B`, which starts at zero, has moved once: after 3 steps both have.
    Put it after `ShardsFromRank0`, so that the starting values are the loaded ones.
    """

    def __init__(self) -> None:
        self.grad_sums: dict[str, float] = {}
        self.expert_change: dict[str, float] = {}
        self._before: dict[str, Any] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._before = {n: full_value(p) for n, p in model.named_parameters()
                        if "lora_" in n and ".experts." in n}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                              **kwargs: Any) -> None:
        for name, p in model.named_parameters():
            if p.requires_grad:
                grad = 0.0 if p.grad is None else float(_local(p.grad).abs().sum())
                self.grad_sums[name] = self.grad_sums.get(name, 0.0) + grad

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.expert_change = {n: float((full_value(p) - self._before[n]).abs().max())
                              for n, p in model.named_parameters() if n in self._before}
        self._before = {}

    def result(self) -> dict[str, Any]:
        return {"lora_grad_sums": self.grad_sums, "expert_adapter_change": self.expert_change}


@contextlib.contextmanager
def _root_gathered(model: Any) -> Iterator[None]:
    """Under FSDP2: the root module's own parameters gathered, for `generate`, which calls past the root's
    forward (the layers gather theirs in their forward); every FSDP group back to its shards afterwards, also
    those that stay gathered after a forward (the output layer). Without FSDP: nothing."""
    from torch.distributed.fsdp import FSDPModule

    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if isinstance(model, FSDPModule):
        model.unshard()
    try:
        yield
    finally:
        for group in groups:
            group.reshard()


def evaluate_gpt_oss(model: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The in-rank evaluation of `helpers.integrations.sft_eval` on a GPT-OSS model as the trainer holds it
    (under FSDP2 sharded, under DDP whole): the held-out loss of all `rows`, each rank's share of the greedy
    answers gathered back in order on every rank, their exact match. Every rank calls it.

    Without the load-balancing loss (a training-time term), with the KV cache. The loss comes first: it runs
    the model's forward through the root module, from which FSDP2 sets itself up; `generate` on a PEFT model
    goes straight to the layers, which would fail under FSDP2 as the first forward.
    """
    from helpers.integrations.sft_eval import answer_budget, exact_match, greedy_answers, prompt_texts
    from helpers.integrations.transformers import answer_loss, gather_shares, rank_and_world, rank_share

    config = model.config
    routed, cached = config.output_router_logits, config.use_cache
    config.output_router_logits, config.use_cache = False, True
    try:
        loss = answer_loss(model, tokenizer, rows, over_ranks=True)
        mine, real = rank_share(rows)   # the same number of rows, so of generate calls, on every rank
        with _root_gathered(model):
            answers = greedy_answers(model, tokenizer, prompt_texts(tokenizer, mine),
                                     answer_budget(tokenizer, rows), synced_gpus=rank_and_world()[1] > 1)
    finally:
        config.output_router_logits, config.use_cache = routed, cached
    answers = gather_shares(answers, real, len(rows))
    return {"accuracy": exact_match(answers, rows), "answers": answers, "loss": loss}


class HeldOutEvaluation(TrainerCallback):
    """The held-out evaluation in the ranks, before the first step (on the loaded, prepared model: put it
    after `ShardsFromRank0`) and after the last: `results["before"]` and `results["after"]`, each as
    `evaluate_gpt_oss` returns it, and `results["seconds"]`, the time it took inside the trainer's `train()`
    (not training time). No rows: nothing is evaluated."""

    def __init__(self, tokenizer: Any, rows: list[dict[str, Any]] | None) -> None:
        self.tokenizer, self.rows = tokenizer, rows
        self.results: dict[str, Any] = {}
        self.seconds = 0.0   # spent evaluating, inside the trainer's train(): not training time

    def _evaluate(self, when: str, model: Any) -> None:
        if self.rows:
            start = time.perf_counter()
            self.results[when] = evaluate_gpt_oss(model, self.tokenizer, self.rows)
            self.seconds += time.perf_counter() - start
            self.results["seconds"] = self.seconds

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._evaluate("before", model)

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._evaluate("after", model)


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
        "local_param_elements": sum(_local(p).numel() for _, p in params),
    }


def memory_table(runs: Mapping[str, list[dict[str, Any]]], planned: Mapping[str, float]) -> Any:
    """The per-rank memory of `StepMemory` runs, in MiB, one row per strategy and rank: the model state held
    (parameters, gradients, optimizer state), their sum beside `planned` (bytes, per strategy), MemTracker's
    step peak and, on GPUs, the CUDA allocator's peak. `runs`: per strategy, each rank's `fine_tune`
    result."""
    import pandas as pd

    rows = {}
    for strategy, ranks in runs.items():
        for rank, run in enumerate(ranks):
            held = run["held"] or {}
            row = {k: v / 2**20 for k, v in held.items()}
            row["model state, measured"] = sum(held.values()) / 2**20
            row["model state, planned"] = planned[strategy] / 2**20
            row["step peak (MemTracker)"] = sum((run["memory"] or {}).values()) / 2**20
            if run.get("cuda_peak_mb") is not None:
                row["CUDA allocator peak"] = run["cuda_peak_mb"]
            rows[(strategy.upper(), f"rank {rank}")] = row
    return pd.DataFrame(rows).T.round(3).rename(columns=lambda c: f"{c}, MiB")
