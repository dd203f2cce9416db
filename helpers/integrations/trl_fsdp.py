"""TRL's SFTTrainer under FSDP2 as notebook 07 runs it: on GPUs or on CPU processes, several trainers in one
rank, the model loaded by rank 0 alone, and what the lesson measures of each run.

What the notebook calls as `trl_fsdp.<name>`, and why it is not in the notebook's recipe; each name lives in
the module named before it and is importable from here too:

* here, `quiet_hugging_face()`: no progress bars, advisory warnings or tokenizer threads, in the kernel and
  its ranks;
* `helpers.integrations.accelerate_fsdp`, the CPU workarounds for accelerate and FSDP2:
  `set_accelerate_config(fsdp_config)`: the environment `accelerate launch --config_file fsdp2.yaml` gives a
  process, set inside a rank that the notebook's launcher started (and reset between the trainers a rank
  runs: accelerate keeps one state per process); `fsdp_on_cpu(trainer_class)`: on CPU processes accelerate
  treats the ranks as MULTI_CPU and silently drops the FSDP plugin (the run would be DDP); the trainer puts
  the same plugin back, so CPU ranks run the FSDP2 code path GPUs run; `NoBackwardPrefetch`: FSDP2 gathers
  one layer at a time in the backward pass, not the next one ahead too (accelerate has no option for it under
  FSDP2): a layer's memory more for the activations at 120B;
* `helpers.integrations.fsdp_tensors`, the model's tensors: `ShardsFromRank0`: rank 0 alone reads the
  checkpoint; every other rank builds the model empty and receives only its shards, once the trainer has
  sharded the model (FSDP2's own `set_model_state_dict(..., broadcast_from_rank0=True)`); on CPU ranks with
  `release_freed_memory()` (glibc's `mallopt`), so that the broadcast's whole-tensor buffers go back to the
  system; `save_trained(...)`: the fine-tuned model (or LoRA adapter) written as `from_pretrained` reads it,
  gathered one tensor at a time; `sharding_summary`: what the checks need to see that FSDP really sharded
  the model;
* the measurements, as `TrainerCallback`s with names: `StepMemory` (what a rank holds in one step, with
  torch's MemTracker) and, for the kernel, `memory_table`, in `helpers.integrations.trainer_memory`;
  `RouterLoad` (the tokens the router sends to each expert) and, for the kernel, `plot_router_load` and
  `plot_losses`, in `helpers.integrations.router_load`; `AdapterUpdates` (LoRA: a gradient in every adapter
  matrix, moved expert adapters) and `HeldOutEvaluation` (the in-rank evaluation of
  `helpers.integrations.sft_eval`, before the first step and after the last, on the model as the ranks hold
  it), in `helpers.integrations.fsdp_evaluation`.

Importing it filters tqdm's "IProgress not found" warning, which importing transformers in a notebook without
ipywidgets would print (the gallery draws its own progress bars); each of those modules does the same.
"""

from __future__ import annotations

import os
import warnings

# tqdm's notebook check, run when transformers is first imported: progress bars come from helpers
warnings.filterwarnings("ignore", message="IProgress not found")

from helpers.integrations.accelerate_fsdp import (  # noqa: E402
    NoBackwardPrefetch,
    accelerate_environment,
    fsdp_on_cpu,
    set_accelerate_config,
)
from helpers.integrations.fsdp_evaluation import AdapterUpdates, HeldOutEvaluation, evaluate_gpt_oss  # noqa: E402
from helpers.integrations.fsdp_tensors import (  # noqa: E402
    M_MMAP_THRESHOLD,
    ShardsFromRank0,
    full_value,
    local_shard,
    release_freed_memory,
    save_trained,
    sharding_summary,
)
from helpers.integrations.router_load import RouterLoad, plot_losses, plot_router_load  # noqa: E402
from helpers.integrations.trainer_memory import StepMemory, memory_table  # noqa: E402

__all__ = [
    "quiet_hugging_face",
    # helpers.integrations.accelerate_fsdp
    "NoBackwardPrefetch", "accelerate_environment", "fsdp_on_cpu", "set_accelerate_config",
    # helpers.integrations.fsdp_tensors
    "M_MMAP_THRESHOLD", "ShardsFromRank0", "full_value", "local_shard", "release_freed_memory",
    "save_trained", "sharding_summary",
    # helpers.integrations.trainer_memory
    "StepMemory", "memory_table",
    # helpers.integrations.router_load
    "RouterLoad", "plot_losses", "plot_router_load",
    # helpers.integrations.fsdp_evaluation
    "AdapterUpdates", "HeldOutEvaluation", "evaluate_gpt_oss",
]


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
