"""DeepSpeed ZeRO under the gallery's launcher (notebook 05): the settings a ZeRO run needs, DeepSpeed on CPU
processes, joining the ranks' process group, and what a rank holds of the model under each stage, measured
and planned.

Why here and not in the lesson: a reader of notebook 05 came for the ZeRO dictionary and TRL's `SFTTrainer`.
What makes DeepSpeed quiet and CPU-ready (its accelerator named up front, its inference-only shared-memory
kernel not compiled, torch's deprecation notes about the collectives it calls silenced) and how a rank's
model state is counted (the ZeRO-3 shard `ds_tensor` of each parameter, the fp32 master partition and the
optimizer's moments behind accelerate's and ZeRO's wrappers) are the same in every run and say nothing about
ZeRO itself; they are named and kept here, each with its reason.

    prepare_deepspeed()                      # the kernel, before DeepSpeed is imported (the ranks inherit it)
    join_group(ctx.backend)                  # every rank, before from_pretrained (zero.Init needs the group)
    loaded_share(model)                      # parameter elements held right after loading: 1/N under ZeRO-3
    model_state_bytes(trainer.model_wrapped) # after training: parameters, fp32 master, optimizer state
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any

STAGES = (0, 1, 2, 3)
# The memory plan's techniques for each stage, and the names the lesson's tables use.
ZERO_TECHNIQUES = {"ddp": "ZeRO-0 (data parallel)", "zero1": "ZeRO-1", "zero2": "ZeRO-2",
                   "zero2_offload": "ZeRO-2 + offload", "zero3": "ZeRO-3",
                   "zero3_offload": "ZeRO-3 + offload"}
MODEL_STATE = ("parameters", "fp32 master", "optimizer state")


def check_zero(zero_stage: Any, offload_optimizer: Any) -> None:
    """A ZeRO stage DeepSpeed has, and an optimizer offload only where ZeRO partitions the optimizer."""
    if isinstance(zero_stage, bool) or zero_stage not in STAGES:
        raise ValueError(f"zero_stage={zero_stage!r} is not a DeepSpeed ZeRO stage: use 0 (plain data "
                         "parallel), 1 (shard optimizer state), 2 (+ gradients) or 3 (+ parameters).")
    if offload_optimizer not in (True, False):
        raise ValueError(f"offload_optimizer={offload_optimizer!r}: use True or False.")
    if offload_optimizer and zero_stage == 0:
        raise ValueError("offload_optimizer=True needs ZeRO: set zero_stage to 1, 2 or 3 (or "
                         "offload_optimizer=False).")


def quiet_logs() -> None:
    """transformers' and DeepSpeed's INFO lines and loading bars, which the lesson's own bars replace."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()   # transformers 5 draws loading/saving bars on stderr
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)


def prepare_deepspeed() -> None:
    """In the kernel, before DeepSpeed is imported (and before `preload`, whose forkserver the ranks fork
    from: they inherit this process's environment).

    Without a GPU, DeepSpeed is told to use its CPU accelerator (`DS_ACCELERATOR=cpu`) rather than left to
    find out and warn at import. Tokenizers run no thread pool (`TOKENIZERS_PARALLELISM=false`): the ranks
    fork after the kernel has tokenized, and a forked pool would warn and deadlock. tqdm's note that
    ipywidgets is missing goes unsaid (the gallery draws its own bars).
    """
    from helpers.launch.options import gpu_count

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message="IProgress not found")
    if not gpu_count():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    quiet_logs()


def join_group(backend: str) -> None:
    """In every rank, before `from_pretrained`: DeepSpeed joins the ranks' process group (`backend`: nccl on
    GPUs, gloo on CPU processes), which `deepspeed.zero.Init` needs to load the weights straight into shards.

    Also, in the rank: fp32 matrix products in full fp32 (no TF32 on GPUs: the stage-parity runs compare
    fp32 steps, and TF32 rounding would blur them; bf16 and fp16 training is unaffected); quiet logs and no
    `datasets` bars; torch's FutureWarning about the old collective names DeepSpeed's ZeRO calls on every step
    (`all_gather_into_tensor`, `reduce_scatter_tensor`: nothing a user can act on); and on CPU processes no
    build of DeepSpeed's shared-memory all-reduce kernel, which serves inference only and costs a g++
    compilation at the first collective.
    """
    import datasets
    import deepspeed
    import torch

    torch.set_float32_matmul_precision("highest")
    quiet_logs()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)`")
    if backend == "gloo":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=backend)


def loaded_share(model: Any) -> dict[str, int]:
    """The parameter elements this rank holds (`local`) of the model's (`total`), right after loading: under
    ZeRO-3 each parameter's partition `ds_tensor` of its `ds_numel` elements (about 1/N of the model when
    `zero.Init` partitioned the loading), else the whole parameter."""
    params = list(model.parameters())
    return {"local": sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in params),
            "total": sum(getattr(p, "ds_numel", p.numel()) for p in params)}


def model_state_bytes(engine: Any) -> dict[str, int]:
    """Bytes of model state this rank holds in a DeepSpeed engine: its parameters, the fp32 master copy of its
    partition (where it is a tensor of its own), and the optimizer's state (Adam's moments, SGD's momentum).

    Under ZeRO-3 a parameter holds its shard (`ds_tensor`) and, while gathered, the whole tensor too (empty
    once released; a parameter under `stage3_param_persistence_threshold` stays gathered on every rank, which
    is what this counts). Gradients are not counted: DeepSpeed frees them after every step.
    """
    import torch

    params = [t for p in engine.module.parameters()
              for t in ((p.ds_tensor, p.data) if hasattr(p, "ds_tensor") else (p,))]
    own = {p.data_ptr() for p in params}
    optimizer = engine.optimizer
    while hasattr(optimizer, "optimizer"):        # accelerate's and ZeRO's wrappers around torch's optimizer
        optimizer = optimizer.optimizer
    master = [p for g in optimizer.param_groups for p in g["params"] if p.data_ptr() not in own]
    states = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
    return {name: sum(t.numel() * t.element_size() for t in tensors)
            for name, tensors in zip(MODEL_STATE, (params, master, states), strict=True)}


def zero_memory_plan(sizes: Mapping[str, Any], world_size: int) -> Any:
    """The memory plan (`helpers.memory_plan`) of each ZeRO stage, in GB a rank holds on its GPU and in CPU
    memory, for each model of `sizes` (name -> `ParamCounts`): mixed precision with AdamW, 16 bytes a
    parameter, split over `world_size` ranks as each stage splits it."""
    import pandas as pd

    from helpers import memory_plan

    def per_stage(counts: Any) -> pd.DataFrame:
        rows = {}
        for technique, label in ZERO_TECHNIQUES.items():
            plan = memory_plan.model_state_bytes(counts, technique, world_size)
            rows[label] = {"GPU per rank": plan.total / 1e9, "CPU per rank": plan.cpu / 1e9}
        return pd.DataFrame(rows).T

    return pd.concat({f"{name}, GB": per_stage(counts) for name, counts in sizes.items()}, axis=1)


def parity_run_plan(counts: Any, stage: int, world_size: int) -> float:
    """The plan's bytes of model state for a rank of the fp32 SGD runs under `stage`, gradients excluded
    (DeepSpeed frees them after each step). SGD keeps one momentum buffer a parameter (`optimizer="sgd"`).
    At fp32 a parameter takes 4 bytes where the plan counts DeepSpeed's working copy in 16 bits: stages 1 and
    2 keep that copy in fp32 beside the fp32 master copy of the rank's partition; at stage 3 the fp32
    partition is itself the master copy the plan counts in the optimizer state."""
    from helpers import memory_plan

    plan = memory_plan.model_state_bytes(counts, "ddp" if stage == 0 else f"zero{stage}", world_size,
                                         optimizer="sgd")
    if stage == 0:   # plain data parallel: fp32 parameters and momentum, the plan's DDP
        return plan.parameters + plan.optimizer
    if stage == 3:
        return plan.optimizer
    return 2 * plan.parameters + plan.optimizer   # the 16-bit copy widened to fp32, then master and momentum


def memory_against_plan(held: Mapping[int, Mapping[str, int]], counts: Any, world_size: int) -> Any:
    """What a rank held under each stage (`held`: stage -> `model_state_bytes`), in MB, with its total, its
    ratio to ZeRO-0's and the memory plan's figure for the same run (`parity_run_plan`)."""
    import pandas as pd

    table = pd.DataFrame({f"ZeRO-{s}": dict(held[s]) for s in sorted(held)}).T / 1e6
    table.columns = [f"{name}, MB" for name in table.columns]
    table["total, MB"] = table.sum(axis=1)
    table["vs ZeRO-0"] = table["total, MB"] / table["total, MB"].iloc[0]
    table["memory plan, MB"] = [parity_run_plan(counts, s, world_size) / 1e6 for s in sorted(held)]
    table["measured / plan"] = table["total, MB"] / table["memory plan, MB"]
    return table
