"""Per-rank profiles and communication counts: what notebook 10 measures around its training loop.

A distributed step is as slow as its slowest rank, so every rank records its own `torch.profiler` trace
(`rank0.json`, `rank1.json`, ...: open one in Perfetto or chrome://tracing), with each step's phases
labelled; `time_by_phase` adds a trace up per phase, and the collectives apart, so that a straggler shows in a
table. `AllreduceCounter` counts what DDP's own all-reduce sends (calls and bytes a step), which is how the
lesson shows what `no_sync` saves. In the loop:

    profiler = RankProfiler(trace_dir, profile_steps, device)   # a no-op when trace_dir is None
    allreduces = AllreduceCounter(ddp_model)                      # wraps DDP's allreduce_hook
    with profiler:
        for step in ...:
            with profiler.label("forward"):
                ...
            allreduces.end_step()
            profiler.step()
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PHASES = ("data", "forward", "backward", "optimizer")
COLLECTIVES = ("all_reduce", "allreduce")   # gloo's and NCCL's names for the op, as the traces show them


class RankProfiler:
    """`torch.profiler` on one rank, writing `trace_dir/rank<N>.json`: one step skipped, one of warm-up, then
    `active` steps recorded. With `trace_dir=None` it records nothing and its labels cost nothing."""

    def __init__(self, trace_dir: str | os.PathLike | None, active: int, device: Any,
                 rank: int | None = None):
        self.trace: str | None = None
        self._profile: Any = None
        if trace_dir is None:
            return
        import torch
        import torch.distributed as dist
        from torch.profiler import ProfilerActivity, profile, schedule

        rank = dist.get_rank() if rank is None else rank
        self.trace = os.path.join(trace_dir, f"rank{rank}.json")
        activities = [ProfilerActivity.CPU]
        if torch.device(device).type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        trace = self.trace
        self._profile = profile(activities=activities, schedule=schedule(wait=1, warmup=1, active=active),
                                on_trace_ready=lambda p: p.export_chrome_trace(trace))

    def __enter__(self) -> RankProfiler:
        if self._profile is not None:
            self._profile.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._profile is not None:
            self._profile.__exit__(*exc)

    def label(self, name: str) -> contextlib.AbstractContextManager:
        """A labelled range in the trace (`record_function`) while profiling; nothing otherwise (a compiled
        model skips the labels, and an unprofiled run need not pay for them)."""
        if self._profile is None:
            return contextlib.nullcontext()
        from torch.profiler import record_function

        return record_function(name)

    def step(self) -> None:
        """The end of a training step: the profiler's schedule advances."""
        if self._profile is not None:
            self._profile.step()


class AllreduceCounter:
    """DDP's own all-reduce (`allreduce_hook`) as a communication hook that counts its calls and bytes (a
    model that is not DDP counts nothing).

    DDP all-reduces its gradient buckets (25 MB each by default, the first 1 MB); under `no_sync()` it keeps
    the gradients local and all-reduces nothing. `end_step()` closes a step's count; `last_step()` is the
    last step's (DDP regroups its buckets after the first step, so the last step is the steady one).
    """

    def __init__(self, ddp_model: Any):
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.parallel import DistributedDataParallel

        self.calls = self.bytes = 0
        self.steps: list[dict[str, int]] = []
        if not isinstance(ddp_model, DistributedDataParallel):   # FSDP: nothing of DDP's to count
            return

        def counting_allreduce(state, bucket):   # no annotations: DDP checks them against its own types
            self.calls += 1
            self.bytes += bucket.buffer().numel() * bucket.buffer().element_size()
            return allreduce_hook(state, bucket)

        ddp_model.register_comm_hook(None, counting_allreduce)

    def end_step(self) -> None:
        self.steps.append({"calls": self.calls, "bytes": self.bytes})
        self.calls = self.bytes = 0

    def last_step(self) -> dict[str, float]:
        last = self.steps[-1] if self.steps else {"calls": 0, "bytes": 0}
        return {"allreduces_per_step": last["calls"], "allreduced_mb_per_step": last["bytes"] / 2**20}


def time_by_phase(trace_path: str | os.PathLike, phases: Sequence[str] = PHASES) -> dict[str, float]:
    """Milliseconds per phase in one rank's Chrome trace: the labelled phases, and the collectives (CPU-side
    events whose name says all-reduce; GPU kernels are left out, their CPU launch already counts)."""
    spent: dict[str, float] = defaultdict(float)
    for event in json.loads(Path(trace_path).read_text())["traceEvents"]:
        if event.get("ph") != "X":
            continue
        name, ms = event.get("name", ""), event.get("dur", 0) / 1e3
        if name in phases:
            spent[name] += ms
        elif event.get("cat") != "kernel" and any(k in name.lower() for k in COLLECTIVES):
            spent["communication"] += ms
    return {phase: spent[phase] for phase in (*phases, "communication")}


def phases_by_rank(traces: Sequence[str | os.PathLike]) -> Any:
    """`time_by_phase` of every rank's trace, one row a rank ("rank 0", "rank 1", ...)."""
    import pandas as pd

    return pd.DataFrame({f"rank {i}": time_by_phase(t) for i, t in enumerate(traces)}).T


def quiet_profiler_on_cpu(device: str) -> None:
    """On a CPU-only run, Kineto's start/stop lines and its failed GPU probe are noise in every rank's output:
    set its log level (inherited by the ranks) unless the user set one."""
    if device == "cpu":
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def run_folder(output_dir: str | os.PathLike | None, notebook: str, fresh: Sequence[str] = ()) -> Path:
    """Where a run writes: `output_dir`; else the gallery run's folder for this notebook (`GALLERY_RUN_DIR`,
    under the gallery runner), else `data/cache/<notebook>`. The `fresh` subfolders are emptied (this run's
    files only) and created."""
    from helpers.paths import cache_dir

    if output_dir:
        folder = Path(output_dir)
    elif os.environ.get("GALLERY_RUN_DIR"):
        folder = Path(os.environ["GALLERY_RUN_DIR"]) / notebook
    else:
        folder = cache_dir(notebook)
    for sub in fresh:
        shutil.rmtree(folder / sub, ignore_errors=True)
        (folder / sub).mkdir(parents=True)
    return folder


def shown(path: str | os.PathLike) -> str:
    """A path as a stored notebook may show it: relative to the repository when inside it."""
    from helpers.paths import ROOT

    path = Path(path)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)



def check_profiling(profile_steps: Any, straggler_ms: Any, device: str) -> None:
    """The profiled run's settings, before any launch: whole steps to record, and a straggler's delay. On a
    CPU-only run, also quiets the profiler (`quiet_profiler_on_cpu`) for the ranks launched after."""
    from helpers.settings import check_whole

    check_whole("profile_steps", profile_steps)
    if isinstance(straggler_ms, bool) or not isinstance(straggler_ms, (int, float)) or straggler_ms < 0:
        raise ValueError(f"straggler_ms={straggler_ms!r} must be a number of milliseconds >= 0 (0: no "
                         "straggler).")
    quiet_profiler_on_cpu(device)


def plot_phases(by_rank: Any, title: str, steps: int) -> Any:
    """Each rank's milliseconds per phase (`phases_by_rank`), one group of bars a rank. Shown; returned."""
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(9, 1.2 + 0.9 * len(by_rank)))
    by_rank.plot.barh(ax=ax, width=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(f"milliseconds over {steps} profiled steps")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_title(title)
    plt.tight_layout()
    plt.show()
    return figure
