"""accelerate's FSDP2 inside a rank that the notebook's launcher started, as notebook 07 runs TRL's trainer:
the settings `accelerate launch --config_file fsdp2.yaml` would give the process, FSDP kept on CPU ranks
(accelerate would silently run them as DDP on gloo), and FSDP2 without backward prefetch.

Why here and not in the lesson: these are workarounds for how accelerate reads its settings, not what the
lesson teaches; the lesson calls each in one line.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

# tqdm's notebook check, run when transformers is first imported: progress bars come from helpers
warnings.filterwarnings("ignore", message="IProgress not found")

from transformers import TrainerCallback  # noqa: E402

# accelerate launch writes the YAML's `fsdp_*` keys as FSDP_* variables; these two are named otherwise
_ENV_NAMES = {"fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP"}


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
