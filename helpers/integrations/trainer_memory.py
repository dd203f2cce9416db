"""What a rank holds in one training step of TRL's trainer (`StepMemory`, with torch's MemTracker) and the
table of it beside the memory plan (`memory_table`), as notebook 07 measures DDP against FSDP.

Why: the lesson's claim that FSDP holds less model state per rank than DDP, and as much as
`helpers.memory_plan` plans, rests on these figures.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

# tqdm's notebook check, run when transformers is first imported: progress bars come from helpers
warnings.filterwarnings("ignore", message="IProgress not found")

from transformers import TrainerCallback  # noqa: E402

from helpers.integrations.fsdp_tensors import local_shard  # noqa: E402


def _nbytes(tensors: Any) -> int:
    return sum(local_shard(t).nbytes for t in tensors if t is not None)


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
