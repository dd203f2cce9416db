"""The data-parallel lessons' proof: the same steps on 1 process and on N give the same losses.

DDP splits every global batch over the ranks and averages their gradients, so N processes, each given its
share of a batch, take the step one process takes on the whole batch. A lesson proves it by launching its
own training function twice with the same arguments, once on 1 process and once on N, and comparing rank 0's
loss curves step by step: a reduction that sums instead of averaging, or a rank that skips the all-reduce,
moves the curves apart from the second step on, while a correct run differs only by the rounding of another
summation order.

    parity = compare_processes(train, parity_cfg, data, plan=plan, key="step_losses")
    print(parity.summary(below=1e-3))
    parity.table(ends=3)

Where the runs go: N is the launch plan's processes on its device when the plan has several (every GPU);
otherwise (one GPU, one process, or no plan) 2 CPU processes with gloo, since two ranks may not share one GPU
and a world of one proves nothing. Both runs use the same device, so the comparison is of the arithmetic only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CPU_PROCESSES = 2   # the comparison's N when the plan has a single process


@dataclass(frozen=True)
class Parity:
    """Rank 0's losses per step on 1 process and on `processes`, on `device`."""

    one: list[float]
    many: list[float]
    processes: int
    device: str

    @property
    def steps(self) -> int:
        return min(len(self.one), len(self.many))

    @property
    def max_diff(self) -> float:
        """The largest absolute difference between the two curves, over the steps both ran."""
        if not self.steps:
            raise ValueError("the runs returned no losses: nothing was compared")
        return max(abs(a - b) for a, b in zip(self.one, self.many, strict=False))

    def summary(self, below: float) -> str:
        """One line for the notebook: the largest difference, or that it is under `below` (the check's)."""
        shown = f"below {below:g}" if self.max_diff < below else f"{self.max_diff:.3g}"
        return f"largest loss difference over {self.steps} steps, 1 vs {self.processes} processes: {shown}"

    def table(self, ends: int | None = None) -> Any:
        """The two curves side by side (a DataFrame by step); `ends`: the first and last `ends` only."""
        import pandas as pd

        frame = pd.DataFrame({"1 process": self.one[:self.steps],
                              f"{self.processes} processes": self.many[:self.steps]},
                             index=pd.RangeIndex(1, self.steps + 1, name="step"))
        if ends is not None and len(frame) > 2 * ends:
            frame = pd.concat([frame.head(ends), frame.tail(ends)])
        return frame


def comparison_launch(plan: Any = None) -> tuple[int, str]:
    """(N, device) of the comparison: the plan's when it has several processes, else 2 CPU processes."""
    if plan is not None and plan.processes > 1:
        return plan.processes, plan.device
    return CPU_PROCESSES, "cpu"


def compare_processes(fn: Any, *args: Any, plan: Any = None, key: str | None = None,
                      batch_size: int | None = None, **options: Any) -> Parity:
    """Launch `fn(*args)` on 1 process, then on N (see `comparison_launch`); compare rank 0's loss curves.

    `fn` is a `@distributed` function; its own launch options hold (a `cluster`, say) except `processes` and
    `device`, and `options` adds more (`threads_per_process=1`). It returns rank 0's losses per step, or a
    dict that holds them under `key`. `batch_size`: the global batch, refused before any launch unless it
    splits evenly over N (else N ranks would step on a smaller batch than one process, and the curves would
    differ for that reason alone).
    """
    processes, device = comparison_launch(plan)
    if batch_size is not None and batch_size % processes:
        raise ValueError(f"batch_size={batch_size} does not split evenly over the {processes} processes of "
                         f"the 1-vs-{processes} comparison: use a multiple of {processes}.")
    one = fn.options(processes=1, device=device, **options).distributed(*args)[0]
    many = fn.options(processes=processes, device=device, **options).distributed(*args)[0]
    return Parity(_losses(one, key), _losses(many, key), processes, device)


def _losses(result: Any, key: str | None) -> list[float]:
    values: Sequence[Any] = result[key] if key is not None else result
    return [float(v) for v in values]
