"""PyTorch Lightning in the gallery's launcher: what a lesson's `Trainer` needs around it, and is not the
lesson.

* `lightning_progress_bar()`: rank 0's progress bar, drawn live in the launching notebook;
* `quiet_lightning()`: the warnings and tips Lightning prints that a reader cannot act on;
* `FitRecord`: a callback that records what a rank returns about its fit (per-epoch metrics, the samples it
  read, time, steps, the strategy and environment Lightning ran);
* `ray_placement()` / `prepare_for_ray(trainer)`: Ray Train's own Lightning integration, on a cluster;
* `mlflow_store(...)` / `show_logged_run(...)`: the MLflow store that `MLFlowLogger` writes to from the ranks,
  and its run read back;
* `ddp_matches_accumulation(...)`: the proof that 2 DDP ranks take the steps of 1 process accumulating their
  two halves of each batch.

Lightning is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.progress import RankProgress, progress_bar

SQLITE = "sqlite:///"   # the prefix of a SQLite store's URI


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


class _NoAdverts(logging.Filter):
    """Lightning's Trainer logs a tip for its cloud logger on every run: not part of a lesson."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


ADVERTS = _NoAdverts()
# Warnings Lightning (and what it imports) gives that a lesson's reader cannot act on, each with its reason.
QUIETED = (
    # tqdm, which Lightning imports, notes once in a notebook that ipywidgets is missing: the bars here are
    # drawn by `lightning_progress_bar` instead.
    "IProgress not found",
    # Streaming's dataset has a length, and Lightning warns that DataLoader worker processes could make it
    # wrong: with num_workers=0 there are none, and Streaming splits the samples over the ranks itself.
    "Your `IterableDataset` has `__len__` defined",
    # Lightning 2.6 still calls torch's older pytree API, which warns on every call: nothing to change here.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)


def quiet_lightning() -> None:
    """Keep out of a lesson's output what Lightning prints that its reader cannot act on: the cloud-logger tip
    of every `Trainer`, advice meant for real data sets (more DataLoader workers, `log_every_n_steps` against
    short epochs: Lightning's `PossibleUserWarning`; the lessons' data is a few thousand in-memory rows and
    `num_workers=0` is the right choice), and the warnings in `QUIETED`.

    Call it in the kernel before Lightning is imported (tqdm's note comes at import), and in each rank.
    """
    for message in QUIETED:
        warnings.filterwarnings("ignore", message=message)
    from lightning.fabric.utilities.warnings import PossibleUserWarning

    warnings.filterwarnings("ignore", category=PossibleUserWarning)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if ADVERTS not in rank_zero.filters:
        rank_zero.addFilter(ADVERTS)


def fit_record(metrics: Sequence[str], sample_key: str | None = None) -> Any:
    """A Lightning callback recording what a rank returns about its fit; `.result(trainer)` after `fit`.

    Per epoch, the values of `metrics` (`trainer.callback_metrics` at the epoch's end, after validation:
    metrics logged with `sync_dist` or all-reduced are the same on every rank); with `sample_key`, the
    `batch[sample_key]` of every batch of the last epoch (which samples this rank read); the fit's wall time
    and optimizer steps; the strategy and cluster environment Lightning ran, and the peak GPU memory.
    """
    from lightning.pytorch.callbacks import Callback

    class FitRecord(Callback):
        def __init__(self) -> None:
            self.rows: list[dict[str, float]] = []
            self.samples: list[Any] = []
            self.seconds = 0.0
            self._start = 0.0

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            self._start = time.perf_counter()

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            self.seconds = time.perf_counter() - self._start

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.samples = []

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            if sample_key is not None:
                self.samples.append(batch[sample_key].cpu())

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            m = trainer.callback_metrics
            values = {k: round(float(m[k]), 6) for k in metrics}
            self.rows.append({"epoch": trainer.current_epoch + 1, **values})

        def result(self, trainer: Any) -> dict[str, Any]:
            import torch

            on_gpu = torch.cuda.is_available() and trainer.strategy.root_device.type == "cuda"
            samples = torch.cat(self.samples).numpy() if self.samples else np.array([], dtype=np.int64)
            environment = getattr(trainer.strategy, "cluster_environment", None)   # None: one process
            return {"history": self.rows, "samples": samples, "seconds": self.seconds,
                    "steps": trainer.global_step, "strategy": type(trainer.strategy).__name__,
                    "environment": environment and type(environment).__name__,
                    "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if on_gpu else None}

    return FitRecord()


def ray_placement() -> dict[str, Any]:
    """`Trainer` arguments for a rank that Ray Train started: Ray Train's own Lightning integration.

    The torch elastic environment the launcher gives on one machine describes the ranks of that machine; on
    a cluster, Ray's tells Lightning each rank's place in the whole cluster (its rank, its node, its device),
    and `prepare_for_ray` refuses a Trainer built otherwise.
    """
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment

    return dict(devices="auto", strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()])


def prepare_for_ray(trainer: Any) -> Any:
    """Ray Train's check of a Trainer built with `ray_placement()` (its `prepare_trainer`)."""
    from ray.train.lightning import prepare_trainer

    return prepare_trainer(trainer)


@dataclass(frozen=True)
class MLflowStore:
    """Where the ranks' `MLFlowLogger` writes: `uri` None with tracking off."""

    uri: str | None
    folder: str | None   # a SQLite store's folder: ranks write there, so on a cluster it must be shared


def mlflow_store(tracking_uri: str | None, experiment: str) -> MLflowStore:
    """Resolve the store (`tracking_uri`, else GALLERY_TRACKING_URI, else the gallery's local store; none with
    GALLERY_TRACKING=off) and create it and `experiment` now, in the kernel: two ranks creating the same
    SQLite database at once would race."""
    from helpers import tracking

    if not tracking.enabled():
        return MLflowStore(None, None)
    uri = tracking.resolve_tracking_uri(tracking_uri)
    tracking.create_experiment(experiment, uri)
    folder = str(Path(uri.removeprefix(SQLITE)).parent) if uri.startswith(SQLITE) else None
    return MLflowStore(uri, folder)


@dataclass(frozen=True)
class LoggedRun:
    """A run read back from MLflow: its name, status, parameters, metric names, and one metric's history."""

    name: str
    status: str
    params: dict[str, str]
    metrics: list[str]
    values: list[float]


def show_logged_run(store: str | None, run_id: str | None, metric: str) -> LoggedRun | None:
    """Read back the run the ranks' `MLFlowLogger` wrote and print what it holds; None with tracking off."""
    if store is None or run_id is None:
        print("tracking is off (GALLERY_TRACKING=off): nothing was logged")
        return None
    from helpers import tracking

    client = tracking.client_for(store)
    run = client.get_run(run_id)
    values = [m.value for m in client.get_metric_history(run_id, metric)]
    logged = LoggedRun(run.info.run_name, run.info.status, dict(run.data.params), sorted(run.data.metrics),
                       values)
    print(f"run {logged.name!r}: status {logged.status}, {len(logged.params)} params, "
          f"metrics: {logged.metrics}")
    print(f"MLflow holds {len(values)} values of {metric}, one per epoch")
    return logged


# --- DDP against one process accumulating gradients ---------------------------------------------------------

@dataclass(frozen=True)
class Parity:
    """Per step, the loss of the global batch on 2 DDP ranks (the mean of theirs) and on 1 process (the mean
    of its two accumulated halves); `max_diff`, the largest difference."""

    table: Any   # a pandas DataFrame indexed by step
    max_diff: float


def _collate(keys: list[str], batch: list[tuple[Any, ...]]) -> dict[str, Any]:
    from torch.utils.data import default_collate

    return dict(zip(keys, default_collate(batch), strict=True))


def _step_losses() -> Any:
    """A callback recording every training batch's loss as `training_step` returned it (Lightning hands the
    callbacks the loss divided by `accumulate_grad_batches`; dividing by 2 and multiplying back is exact)."""
    from lightning.pytorch.callbacks import Callback

    class StepLosses(Callback):
        def __init__(self) -> None:
            self.values: list[float] = []

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                               batch_idx: int) -> None:
            self.values.append(outputs["loss"].item() * trainer.accumulate_grad_batches)

    return StepLosses()


def _fit_steps(make_module: Callable[[], Any], columns: dict[str, np.ndarray], batch_size: int, steps: int,
               lr: float, seed: int, root: str) -> list[float]:
    """In each rank: `steps` steps of the module on fixed samples, in fp32 on the CPU, one intra-op thread.

    On 2 ranks, rank r reads rows r, r + 2, r + 4, ... (its half of each global batch) and DDP averages the
    two gradients; on 1 process, each step reads rank 0's half, then rank 1's, and accumulates them
    (`accumulate_grad_batches=2`: Lightning scales each half's loss by 1/2)."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from helpers.context import worker_context

    ctx = worker_context()
    quiet_lightning()
    L.seed_everything(seed, verbose=False)
    torch.set_float32_matmul_precision("highest")   # fp32 means fp32 for the comparison
    dataset = TensorDataset(*[torch.as_tensor(v) for v in columns.values()])
    if ctx.world_size == 2:   # the process group does not exist yet (Lightning makes it in fit)
        sampler: Any = DistributedSampler(dataset, num_replicas=2, rank=ctx.rank, shuffle=False)
    else:
        sampler = [i for step in range(steps) for r in (0, 1)
                   for i in range(step * batch_size + r, (step + 1) * batch_size, 2)]
    loader = DataLoader(dataset, batch_size=batch_size // 2, sampler=sampler,
                        collate_fn=functools.partial(_collate, list(columns)))
    module = make_module()
    # SGD with momentum in place of the module's own optimizer: its steps grow with the gradient's scale
    module.configure_optimizers = lambda: torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
    losses = _step_losses()
    trainer = L.Trainer(accelerator="cpu", devices=ctx.world_size, precision="32-true", max_steps=steps,
                        strategy="ddp" if ctx.world_size > 1 else "auto",
                        logger=False, accumulate_grad_batches=2 if ctx.world_size == 1 else 1,
                        use_distributed_sampler=False, limit_val_batches=0, enable_checkpointing=False,
                        enable_model_summary=False, enable_progress_bar=False, default_root_dir=root,
                        callbacks=[losses])
    trainer.fit(module, train_dataloaders=loader)
    return losses.values


def ddp_matches_accumulation(make_module: Callable[[], Any], columns: Mapping[str, Sequence[Any]], *,
                             batch_size: int, steps: int, lr: float, seed: int) -> Parity:
    """Run the first `steps` steps twice from the same initial weights (`make_module()` after seeding with
    `seed`) on the same samples (the first `steps * batch_size` of `columns`): on 2 DDP ranks, and on 1
    process that accumulates the two ranks' halves of each batch. Both on this machine's CPU, in fp32, with
    one intra-op thread per rank (a matmul summed by 2 threads can round differently than by 1).

    Under DDP each rank's gradient is averaged with the other's: exactly the gradient of one process that
    runs the two halves one after the other and accumulates them. Both runs train with SGD (momentum 0.9,
    learning rate `lr`) in place of the module's own optimizer: SGD's steps grow with the gradient's scale,
    so a reduction that summed the gradients would take steps twice as large and show at once (Adam would
    divide the scale away). The module's `training_step` returns its loss, which both runs record per step.
    """
    import pandas as pd

    from helpers.launch import distributed

    if batch_size % 2:
        raise ValueError(f"batch_size={batch_size}: the comparison splits each batch in two halves; use an "
                         "even batch size.")
    n = steps * batch_size
    arrays = {k: np.stack(np.asarray(v)[:n]) for k, v in columns.items()}
    fit = distributed(_fit_steps, processes=1, device="cpu", threads_per_process=1)
    with tempfile.TemporaryDirectory(prefix="parity-") as root:
        two = fit.options(processes=2).distributed(make_module, arrays, batch_size, steps, lr, seed, root)
        one = fit.distributed(make_module, arrays, batch_size, steps, lr, seed, root)[0]
    ddp = np.mean(two, axis=0)                         # the global batch's loss, per step
    accumulated = np.asarray(one).reshape(-1, 2).mean(1)   # the mean of the two halves, per step
    table = pd.DataFrame({"2 DDP ranks": ddp, "1 process, 2 accumulated halves": accumulated},
                         index=pd.RangeIndex(1, steps + 1, name="step"))
    return Parity(table, float(np.abs(ddp - accumulated).max()))
