"""What a hand-written training loop needs around the technique, kept out of the lesson's loop: the step cap,
rank 0's progress bar, the clock, the peak GPU memory and the node the rank ran on.

    steps = StepHarness(cfg["epochs"], len(loader), cfg["max_steps"])   # all epochs, or a capped test run
    for epoch in range(steps.epochs):
        sampler.set_epoch(epoch)
        for x, y in steps.batches(loader):       # stops at the cap; advances the bar after each step
            ...
        steps.show(epoch=epoch + 1, loss=...)    # the bar's postfix
    return {"history": history, **steps.finish(samples_per_step=cfg["batch_size"])}

A loop counted in steps rather than epochs takes `StepHarness(1, cfg["steps"], cfg["max_steps"])` and
`for step in steps.steps():`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from helpers.progress import progress_bar
from helpers.step_cap import cap_steps

T = TypeVar("T")


class StepHarness:
    """The step cap (`max_steps`), rank 0's progress bar, and the run's figures, for one training run."""

    def __init__(self, epochs: int, steps_per_epoch: int, max_steps: int | None, *, desc: str = "training",
                 start_step: int = 0):
        self.epochs, self.per_epoch = cap_steps(epochs, steps_per_epoch, max_steps)
        self.total = self.epochs * self.per_epoch
        self.done = start_step
        self._bar = progress_bar(total=self.total, desc=desc, unit="step", initial=start_step)
        self._start = time.perf_counter()

    def batches(self, loader: Iterable[T]) -> Iterator[T]:
        """One epoch of `loader`, cut at this run's steps per epoch; the bar advances after each step."""
        for index, batch in enumerate(loader):
            if index == self.per_epoch:
                return
            yield batch
            self.done += 1
            self._bar.update()

    def steps(self) -> Iterator[int]:
        """The step numbers of a run counted in steps (from `start_step` on a resumed run)."""
        while self.done < self.total:
            yield self.done
            self.done += 1
            self._bar.update()

    def show(self, **values: Any) -> None:
        """Values to show beside rank 0's bar (the epoch, the last loss)."""
        self._bar.set_postfix(**values)

    def finish(self, samples_per_step: int | None = None, device: Any = None) -> dict[str, Any]:
        """Close the bar; the run's seconds, steps, samples/s, peak GPU memory (MB) and node."""
        import torch

        from helpers.context import worker_context

        self._bar.close()
        seconds = time.perf_counter() - self._start
        device = torch.device(device or worker_context().device)
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        rate = self.done * samples_per_step / seconds if samples_per_step and seconds > 0 else None
        return {"train_seconds": seconds, "steps_run": self.done, "samples_per_s": rate, "peak_gpu_mb": peak,
                "node": worker_context().node}
