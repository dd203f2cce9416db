"""Lightning: a progress-bar callback that draws rank 0's bar in the launching notebook."""

from __future__ import annotations

from typing import Any

from helpers.progress import RankProgress, progress_bar


def lightning_progress_bar() -> Any:
    """A Lightning `ProgressBar` callback that draws through `progress_bar` (Lightning's TQDM bar
    cannot be shown live through a worker's log). Pass it in `Trainer(callbacks=[...])`."""
    from lightning.pytorch.callbacks import ProgressBar

    class HelpersProgressBar(ProgressBar):
        def __init__(self) -> None:
            super().__init__()
            self._enabled = True
            self._bar: RankProgress[Any] | None = None

        def disable(self) -> None:
            self._enabled = False

        def enable(self) -> None:
            self._enabled = True

        @property
        def is_enabled(self) -> bool:
            return self._enabled

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if self._enabled:
                epochs = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
                self._bar = progress_bar(total=self.total_train_batches,
                                         desc=f"epoch {trainer.current_epoch + 1}{epochs}", unit="batch",
                                         rank=trainer.global_rank)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            if self._bar is not None:
                self._bar.set_postfix(refresh=False, **self._metrics(trainer, pl_module))
                self._bar.update(batch_idx + 1 - self._bar.n)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if self._bar is not None:  # validation has run by now: its metrics go on the closed bar
                self._bar.set_postfix(refresh=False, **self._metrics(trainer, pl_module))
                self._bar.close()
                self._bar = None

        def _metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
            return {k: v for k, v in self.get_metrics(trainer, pl_module).items() if k != "v_num"}

        def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    return HelpersProgressBar()
