"""FSDP2 lessons' plumbing around `fully_shard`: what a rank really holds, sharded checkpoints that are either
complete or absent, a rank that dies on purpose (04's crash demo), the settings checks and the figures.

The lessons (04, and 10's elastic resume) keep the technique in view: `fully_shard`, the training loop, the
all-reduced loss. What is here is what proves it or makes it safe, named so that the loop reads like
PyTorch's own FSDP2 example:

    checkpoints = ShardedCheckpoints(output_dir)           # step_NNNNNN/ folders, each complete or absent
    resumed = checkpoints.resume(model, optimizer)         # DCP: each rank reads its shards, any world size
    ...
        crash_once(fail_at, step)                          # the demo: the last rank dies (first attempt)
        ...
        memory = memory or held_bytes(model, optimizer, device)   # after a step: parameters, gradients, state
        history.append(mean_over_ranks(loss))
        checkpoints.save(step, model, optimizer, history=history)  # DCP: every rank writes its own shards

In the notebook's process: `check_checkpoints` and `check_elastic` refuse bad settings before any launch;
`sharding_table` and `plan_gap` set what the ranks held beside `helpers.memory_plan`'s plan;
`plot_bits_per_byte`, `plot_resume` and `plot_elastic` draw the lessons' figures.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

CHECKPOINT_GLOB = "step_??????"
ROLES = ("parameters", "gradients", "optimizer state")


def _local(tensor: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def held_bytes(model: Any, optimizer: Any, device: Any) -> dict[str, int]:
    """What this rank really holds on `device`, by role: every live tensor's storage, counted once.

    Measured, not computed from the shard sizes: a walk over Python's objects (`gc.get_objects`) finds every
    tensor, and each storage is counted once, under "parameters", "gradients" or "optimizer state" when one of
    those owns it, else under "other" (activations still referenced, buffers FSDP or DDP keeps on the side).
    An FSDP that kept its gathered weights, or a copy of the gradients, would show here. Call it after an
    optimizer step and before `zero_grad`, when gradients and optimizer state exist.
    """
    import torch
    from torch.distributed.tensor import DTensor

    device = torch.device(device)

    def key(t: Any) -> int:
        return _local(t).untyped_storage().data_ptr()

    roles = {"parameters": {key(p) for p in model.parameters()},
             "gradients": {key(p.grad) for p in model.parameters() if p.grad is not None},
             "optimizer state": {key(v) for s in optimizer.state.values() for v in s.values()
                                 if torch.is_tensor(v) and v.dim() > 0}}
    held = {role: 0 for role in [*roles, "other"]}
    seen: set[int] = set()
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads obj.__class__, and some objects on the heap (the
        # deprecated torch.distributed.reduce_op) warn on every attribute read
        if not issubclass(type(obj), torch.Tensor) or issubclass(type(obj), DTensor) or obj.device != device:
            continue
        try:
            storage = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):   # tensors without storage of their own
            continue
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        role = next((r for r, keys in roles.items() if storage.data_ptr() in keys), "other")
        held[role] += storage.nbytes()
    return held


def latest_checkpoint(root: str | Path | None) -> Path | None:
    """The newest complete checkpoint under `root`: a renamed (not .tmp) folder with DCP's metadata in it."""
    if root is None or not Path(root).is_dir():
        return None
    done = [d for d in Path(root).glob("step_*") if d.is_dir() and not d.name.endswith(".tmp")
            and (d / ".metadata").exists()]
    return max(done, key=lambda d: int(d.name.split("_")[1]), default=None)


class ShardedCheckpoints:
    """`root/step_NNNNNN/` checkpoints written by every rank with `torch.distributed.checkpoint` (DCP).

    `save` writes the model's and the optimizer's state, each rank its own shards, in parallel
    (`get_state_dict`, then `dcp.save`), plus a small per-rank file of the loop's own state (the step, what
    it recorded so far, the RNG) into `step_NNNNNN.tmp/`, and rank 0 renames the folder to `step_NNNNNN/`
    only after every rank has finished. A rename is atomic, so a crash mid-write leaves a `.tmp` folder that
    `latest` ignores, never a half-written checkpoint that looks complete. The newest `keep` are kept.

    `resume` loads the newest complete one into the sharded model and optimizer: `get_state_dict` gives this
    rank's state (shards), `dcp.load` fills it from the files (each rank reads the pieces of its own shards,
    whatever the world size that wrote them), and `set_state_dict` puts it back. With `root=None` nothing is
    saved or found.
    """

    def __init__(self, root: str | Path | None, keep: int = 2):
        self.root = Path(root) if root is not None else None
        self.keep = keep

    @property
    def latest(self) -> Path | None:
        return latest_checkpoint(self.root)

    def save(self, step: int, model: Any, optimizer: Any, **trainer: Any) -> Path | None:
        """Every rank: write step `step`'s checkpoint (collective: all ranks must call it); its folder."""
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        if self.root is None:
            return None
        rank = dist.get_rank()
        tmp, final = self.root / f"step_{step:06d}.tmp", self.root / f"step_{step:06d}"
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)     # the leftover of a crash mid-write
        dist.barrier()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp)   # each rank its shards
        torch.save({"step": step, "rng": torch.get_rng_state(), **trainer}, tmp / f"trainer_rank{rank}.pt")
        dist.barrier()                                   # every rank's files are on disk
        if rank == 0:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)                        # the commit point: atomic
            for old in sorted(self.root.glob(CHECKPOINT_GLOB))[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return final

    def resume(self, model: Any, optimizer: Any) -> dict[str, Any] | None:
        """Every rank: load the newest complete checkpoint into `model` and `optimizer` (collective), whatever
        the number of ranks that wrote it; the loop's state saved with it (the step, what it recorded; the RNG
        state restored), or None when there is none. Rank 0 prints where it resumed, and on which attempt of
        the group (`TORCHELASTIC_RESTART_COUNT`)."""
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        latest = self.latest
        if latest is None:
            return None
        model_state, optim_state = get_state_dict(model, optimizer)   # this rank's shards, to fill in
        dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=latest)
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
        rank = dist.get_rank()
        own = latest / f"trainer_rank{rank}.pt"
        # a rank the writing group did not have (a resume on more ranks) takes rank 0's: the loop's state is
        # the same on every rank, and the RNG state is only what one rank had
        state = torch.load(own if own.exists() else latest / "trainer_rank0.pt")
        torch.set_rng_state(state["rng"])
        if rank == 0:
            print(f"attempt {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}: resumed from {latest.name}")
        return state


def crash_once(fail_at: int | None, step: int) -> None:
    """The crash demo: at step `fail_at` the last rank dies like a lost machine (`os._exit`: no exception, no
    clean-up), on the group's first attempt only, so that the restarted group runs through.

    The line it prints leaves a second before the exit: on a cluster a Ray actor carries a rank's output to
    the notebook asynchronously.
    """
    import torch.distributed as dist

    if fail_at != step or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) != 0:
        return
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == world_size - 1:
        print(f"rank {rank}: simulated crash at step {step}", flush=True)
        time.sleep(1)
        os._exit(1)


def check_checkpoints(checkpoint_every: Any, fail_at_step: Any, steps: int, max_steps: int | None,
                      cpu_offload: Any = False, device: str = "cpu") -> None:
    """04's own settings, before any launch: checkpoints at a whole number of steps, a crash demo that falls
    after a checkpoint and within the run, and `cpu_offload` only where there is a GPU to offload from."""
    from helpers.settings import check_choice, check_whole

    check_whole("checkpoint_every", checkpoint_every)
    check_choice("cpu_offload", cpu_offload, (False, True))
    if cpu_offload and device != "cuda":
        raise ValueError("cpu_offload=True keeps a GPU's shards in CPU memory; these ranks run on the CPU "
                         "already: set cpu_offload=False.")
    if fail_at_step is None:
        return
    check_whole("fail_at_step", fail_at_step, minimum=2, hint=", or None to skip the crash demo")
    if max_steps is not None and fail_at_step > max_steps:
        raise ValueError(f"fail_at_step={fail_at_step} lies beyond max_steps={max_steps}: the crash would "
                         "never happen. Lower fail_at_step, raise max_steps, or set fail_at_step=None.")
    if fail_at_step > steps:
        raise ValueError(f"fail_at_step={fail_at_step} must lie in 2..steps ({steps}), or be None to skip "
                         "the demo.")
    if fail_at_step <= checkpoint_every:
        raise ValueError(f"fail_at_step={fail_at_step} comes before the first checkpoint (step "
                         f"{checkpoint_every}): there would be nothing to resume from. Raise fail_at_step or "
                         "lower checkpoint_every.")


def sharding_table(counts: Any, world_size: int, measured: dict[str, dict[str, int]],
                   optimizer: str = "sgd") -> Any:
    """MiB a rank holds, by role: for each technique in `measured` ("DDP", "FSDP": what `held_bytes` returned
    on rank 0), the plan (`helpers.memory_plan.model_state_bytes` for these parameter `counts`, `world_size`
    ranks and `optimizer`) beside the measurement; a "model state" and a "total" row; and FSDP / DDP of the
    measured amounts. The plan counts model state only, so its "other" and "total" stay empty.
    """
    import pandas as pd

    from helpers.memory_plan import model_state_bytes

    attributes = {"parameters": "parameters", "gradients": "gradients", "optimizer state": "optimizer"}
    columns = {}
    for name, held in measured.items():
        plan = model_state_bytes(counts, name.lower(), world_size, optimizer=optimizer)
        columns[f"{name} planned"] = {role: getattr(plan, a) for role, a in attributes.items()}
        columns[f"{name} rank 0"] = held
    table = pd.DataFrame(columns).reindex([*ROLES, "other"]) / 2**20
    table.loc["model state"] = table.loc[list(ROLES)].sum()
    table.loc["total"] = table.loc[["model state", "other"]].sum(min_count=2)   # the plan has no "other"
    table["FSDP / DDP"] = table["FSDP rank 0"] / table["DDP rank 0"]
    return table.rename_axis("MiB held")


def plan_gap(table: Any, names: Iterable[str] = ("DDP", "FSDP")) -> float:
    """The largest relative difference of a measured role from its plan, over `names` (`sharding_table`)."""
    import numpy as np

    names = list(names)
    measured = table.loc[list(ROLES), [f"{n} rank 0" for n in names]].to_numpy()
    planned = table.loc[list(ROLES), [f"{n} planned" for n in names]].to_numpy()
    return float(np.abs(measured / planned - 1).max())


def plot_resume(uninterrupted: Sequence[float], resumed: Sequence[float], crashed_at: int,
                resumed_from: int, ylabel: str = "training bits per byte") -> Any:
    """The crash demo's figure: the uninterrupted run's curve (wide, pale) under the resumed run's (thin,
    black), with the crash and the checkpoint it resumed from marked. Shown; the figure is returned."""
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(range(1, len(uninterrupted) + 1), uninterrupted, lw=3, alpha=0.4, label="uninterrupted")
    ax.plot(range(1, len(resumed) + 1), resumed, lw=1, color="k", label="crashed and resumed")
    ax.axvline(crashed_at, color="red", ls=":", label=f"crash (step {crashed_at})")
    ax.axvline(resumed_from, color="green", ls="--", label=f"resumed from step {resumed_from}")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend()
    plt.tight_layout()
    plt.show()
    return figure


def plot_bits_per_byte(history: Any, evals: Any, baseline: float, title: str) -> Any:
    """The lesson's learning curves in bits per byte: the training loss of every step (`history`: step,
    train_loss in nats), the validation evaluations (`evals`: step, val_bits_per_byte) and the unigram
    baseline as a dashed line. Shown; the figure is returned."""
    import math

    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(history["step"], history["train_loss"] / math.log(2), lw=1, label="training (global batch)")
    ax.plot(evals["step"], evals["val_bits_per_byte"], "o-", label="validation")
    ax.axhline(baseline, color="gray", ls="--", label=f"unigram baseline ({baseline:.2f})")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.set_ylim(0, 8.5)
    ax.legend()
    ax.set_title(title)
    plt.tight_layout()
    plt.show()
    return figure


def mean_over_ranks(value: Any) -> float:
    """The mean of a scalar tensor over the ranks (an all-reduce of the sum, divided by the world size): the
    loss of the whole global batch, the same number on every rank."""
    import torch.distributed as dist

    total = value.detach().float()
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def check_elastic(resume_world_sizes: Any, plan: Any, *, batch_size: int, micro_batches: Any,
                  steps: int) -> tuple[int, str]:
    """10's settings, before any launch: the world sizes a checkpoint is resumed on, and a global batch that
    splits over every world size and into the micro-batches. Returns the elastic run's world size and device.

    The batch of a step is the same for any number of ranks (`global_batch`), which is what lets a resumed
    run take the same steps; so the batch must split evenly over the DDP runs' ranks (`plan`), over the
    elastic run's (at least 2, to have something to reshard), and over every resume's. The elastic section
    needs its largest world size at once: on GPUs when there are that many, else on CPU processes.
    """
    import math

    import torch

    from helpers.settings import check_whole

    check_whole("micro_batches", micro_batches)
    if steps < 2:
        raise ValueError(f"steps={steps}: the runs need at least 2 steps (the elastic run saves half-way and "
                         "resumes); the step times are steady from the third step on.")
    if isinstance(resume_world_sizes, str):
        raise ValueError(f"resume_world_sizes={resume_world_sizes!r} is a string: papermill's -p passes "
                         "lists as text; use -y 'resume_world_sizes: [1, 4]'.")
    if not resume_world_sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 1
                                     for n in resume_world_sizes):
        raise ValueError(f"resume_world_sizes={resume_world_sizes!r}: give a list of world sizes >= 1, e.g. "
                         "[1, 4].")
    save_world = max(2, plan.processes)
    gpus = torch.cuda.device_count() if plan.device == "cuda" else 0
    device = "cuda" if gpus >= max(save_world, *resume_world_sizes) else "cpu"
    fits = math.lcm(plan.processes * micro_batches, save_world, *resume_world_sizes)   # batch sizes that work
    for world, what in [(plan.processes, "the DDP runs"), (save_world, "the elastic run"),
                        *[(n, f"the resume on {n}") for n in resume_world_sizes]]:
        if batch_size % world:
            raise ValueError(f"batch_size={batch_size} does not split over the {world} ranks of {what}: use "
                             f"a multiple of {fits}.")
    if (batch_size // plan.processes) % micro_batches:
        raise ValueError(f"each of the {plan.processes} ranks gets {batch_size // plan.processes} sequences "
                         f"a step, which micro_batches={micro_batches} does not divide: change "
                         f"micro_batches, or use a batch_size that is a multiple of {fits}.")
    return save_world, device


def plot_elastic(uninterrupted: Sequence[float], resumed: dict[int, Sequence[float]], save_at: int,
                 save_world: int) -> Any:
    """10's elastic figure: the uninterrupted run's loss (wide, pale) and each resumed run's from the
    checkpoint on (thin, a marker each, since the curves coincide). Shown; the figure is returned."""
    import matplotlib.pyplot as plt
    import numpy as np

    steps = np.arange(1, len(uninterrupted) + 1)
    figure, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(steps, uninterrupted, lw=4, alpha=0.35, label=f"uninterrupted, {save_world} ranks")
    for i, (world, losses) in enumerate(resumed.items()):
        ax.plot(steps[save_at:], losses, lw=1, marker="ox+^sv*"[i % 7], ms=7, mfc="none",
                label=f"resumed on {world}")
    ax.axvline(save_at + 0.5, color="gray", ls="--", label=f"checkpoint (step {save_at})")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats per byte)")
    ax.legend()
    plt.tight_layout()
    plt.show()
    return figure
