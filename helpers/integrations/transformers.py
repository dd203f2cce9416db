"""transformers (Trainer, TRL's SFTTrainer): a callback that draws rank 0's optimiser steps in the launching
notebook."""

from __future__ import annotations

from typing import Any

from helpers.progress import RankProgress, progress_bar


def transformers_progress_callback(desc: str = "training") -> Any:
    """A `transformers.TrainerCallback` (Trainer, TRL's SFTTrainer) that draws the optimiser steps through
    `progress_bar`, with the last logged loss. Use it with `disable_tqdm=True`."""
    from transformers import TrainerCallback

    class HelpersProgressCallback(TrainerCallback):
        def __init__(self) -> None:
            self._bar: RankProgress[Any] | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._bar = progress_bar(total=state.max_steps, desc=desc, unit="step",
                                     rank=0 if state.is_world_process_zero else 1)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._bar is not None:
                self._bar.update(state.global_step - self._bar.n)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
                   **kwargs: Any) -> None:
            if self._bar is not None and logs and "loss" in logs:
                self._bar.set_postfix(loss=float(logs["loss"]))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    return HelpersProgressCallback()
