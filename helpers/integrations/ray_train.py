"""Ray Train around notebook 06's training function: what the lesson needs that Ray Train's own quickstart
leaves out, so that the notebook reads like that quickstart.

In the notebook's kernel:

    ray_train.quiet_ray()                    # before `import ray`: Ray's output kept to what a reader needs
    session = ray_train.connect(cluster)      # ray.init(): the cluster, or a private instance on this machine
    config["shared"] = session.mark(output_dir=storage)   # each worker checks that it sees the folder
    with ray_train.timed() as clock:          # rank 0's progress bar drawn under the cell; fit()'s seconds
        result = trainer.fit()
    history = ray_train.history_of(result)    # the per-epoch history the last checkpoint carries
    resume = ray_train.resume_evidence(result, history, config, make_resnet())   # the restart's proof

In each Ray Train worker (`train_loop_per_worker`):

    nodes = ray_train.start_worker(config["shared"])    # storage seen here; every rank's Ray node
    steps = ray_train.EpochSteps(config)                # epochs x steps (max_steps), bar, losses, images/s
    ray_train.evaluate(model, val_shard, loss_fn, autocast)   # all-reduced validation accuracy and loss
    ray_train.restored_state(...), ray_train.mean_over_workers(losses)

Nothing here changes what the workers compute: the evaluation and the all-reduced loss are the lesson's own
code, moved here verbatim so that the training function shows the recipe (model, optimizer, schedule,
checkpoint, report) and not the measurement around it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.progress import progress_bar, relay_ray_progress
from helpers.shared_storage import SharedPaths, shared_paths
from helpers.step_cap import cap_steps

# Ray's defaults, changed for a lesson whose cells a reader reads; each only where the user set nothing.
RAY_SETTINGS = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",      # ray.train.report() otherwise waits ~1.7 s each time
    "RAY_DEDUP_LOGS": "0",                           # every rank's lines, not one of them (read at import)
    "RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION": "0",   # helper actors a one-job lesson does not need
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_ENABLE_CONTROLLER_STRUCTURED_LOGGING": "0",   # JSON log files nobody reads here
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    # Deprecation notices from libraries inside Ray's worker processes: nothing a reader can change.
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",
}
# Ray Data's notes on its own settings, and MLflow's INFO lines about database migrations.
QUIET_LOGGERS = ("ray.data", "mlflow")
FAIL_AT_EPOCH_RULE = "must be None or between 2 and epochs"
NOT_RESUMED = {"resumed_from_epoch": 0, "restored_val_accuracy": math.nan, "restored_val_loss": math.nan,
               "restored_schedule_step": -1, "restored_momentum_buffers": -1}


def quiet_ray() -> None:
    """Ray's output kept to what a reader needs; call it before `import ray` (some settings are read then).

    Sets RAY_SETTINGS as defaults in this process's environment (a private Ray instance and its workers
    inherit them), imports Ray without its notes about missing widgets, and lowers QUIET_LOGGERS to errors.
    """
    for name, value in RAY_SETTINGS.items():
        os.environ.setdefault(name, value)
    from helpers.launch.ray_instance import import_ray

    import_ray()
    warnings.filterwarnings("ignore", message="IProgress not found")   # tqdm's, when a later import asks
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def check_fail_at_epoch(fail_at_epoch: Any, epochs: int, max_steps: int | None) -> None:
    """The crash demo needs a checkpoint to resume from: the worker is lost in epoch 2 or later."""
    if fail_at_epoch is None:
        return
    if max_steps is not None:
        raise ValueError("max_steps caps the run to a few steps, too few for the crash demo: set "
                         "fail_at_epoch=None.")
    whole = isinstance(fail_at_epoch, int) and not isinstance(fail_at_epoch, bool)
    if not whole or not 2 <= fail_at_epoch <= epochs:
        raise ValueError(f"fail_at_epoch={fail_at_epoch!r} {FAIL_AT_EPOCH_RULE}={epochs}: the worker must "
                         "die after a first checkpoint exists, so training can resume from it.")


class RaySession:
    """A Ray connection held open across the notebook's cells, and the paths marked for the workers' check."""

    def __init__(self, cluster: str | None):
        from helpers.launch import ray_session

        self._stack = contextlib.ExitStack()
        # The workers' output reaches this cell; Ray's libraries in the workers log only critical messages
        # (the surviving worker's report of its peer killed on purpose would print a long traceback), and the
        # raylet's report of the dead worker, which names ids and addresses, is dropped.
        self.ray = self._stack.enter_context(ray_session(cluster or "ray", log_to_driver=True,
                                                         worker_log_level="CRITICAL", raylet_notices=False))
        self.ray.data.DataContext.get_current().enable_progress_bars = False

    def describe(self) -> str:
        resources = self.ray.cluster_resources()
        return (f"Ray {self.ray.__version__}: {len(self.ray.nodes())} node(s), {resources.get('CPU', 0):.0f} "
                f"CPUs, {resources.get('GPU', 0):.0f} GPUs")

    def mark(self, **paths: str | None) -> SharedPaths:
        """Mark local folders for `SharedPaths.check()` in each worker; the marks go when the session closes.

        A URL (s3://, gs://) is reached the same way from every node and is not marked.
        """
        local = {name: None if path is None or "://" in str(path) else path for name, path in paths.items()}
        return self._stack.enter_context(shared_paths(**local))

    def close(self) -> None:
        """Remove the marks; shut a private Ray instance down, every process included (your cluster stays)."""
        self._stack.close()


def connect(cluster: str | None) -> RaySession:
    """`ray.init()` for the notebook: `cluster`'s address ("auto", "ray://head:10001"), or with None a
    private Ray instance on this machine (no dashboard, its files in a short temporary folder). Prints what
    Ray has."""
    session = RaySession(cluster)
    print(session.describe())
    return session


@dataclass
class Clock:
    """The seconds a `timed()` block took (NaN until it ends)."""

    seconds: float = math.nan


@contextlib.contextmanager
def timed() -> Iterator[Clock]:
    """Around `trainer.fit()`: rank 0's `progress_bar` drawn under the cell (through a small Ray actor, so it
    works with workers on other machines), and the seconds the block took."""
    clock = Clock()
    start = time.perf_counter()
    with relay_ray_progress():
        yield clock
    clock.seconds = time.perf_counter() - start
    print(f"trained in {clock.seconds:.1f} s")


# In each worker


def worker_device() -> Any:
    """This Ray Train worker's torch device: its GPU, or the CPU (`ray.train.torch.get_device`)."""
    from ray.train.torch import get_device

    return get_device()


def start_worker(shared: SharedPaths) -> str:
    """First thing in a Ray Train worker: check that the marked paths (output_dir) are on storage this
    worker sees (`SharedStorageError` naming the path and the node otherwise); make this worker's GPU the
    current one; return the Ray node of every rank, space-separated, in rank order (all ranks call it)."""
    import ray
    import torch
    import torch.distributed as dist

    shared.check()
    # Ray Data hands read-only arrays to torch.as_tensor; the training loop never writes to its batches.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    device = worker_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)   # all_gather_object goes through this GPU under NCCL
    nodes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, ray.get_runtime_context().get_node_id())
    return " ".join(nodes)


class EpochSteps:
    """The run's length, rank 0's progress bar, each epoch's losses and speed, in a Ray Train worker.

    `config` has epochs, n_train, batch_size (global) and max_steps: the run is `epochs` passes of
    n_train // batch_size steps, or fewer under the `max_steps` cap (helpers.step_cap).
    """

    def __init__(self, config: Mapping[str, Any], desc: str = "training"):
        self.epochs_run, self.per_epoch = cap_steps(
            config["epochs"], config["n_train"] // config["batch_size"], config["max_steps"])
        self.total = self.epochs_run * self.per_epoch
        self.batch_size = config["batch_size"]
        self.desc = desc
        self.losses: list[float] = []   # this worker's losses of the current epoch
        self._bar: Any = None
        self._seconds = math.nan

    def epochs(self, start_epoch: int = 0) -> Iterator[int]:
        """The epochs left to run (0-based), from `start_epoch` on a resumed run; the bar lives around
        them."""
        desc = self.desc + (" (resumed)" if start_epoch else "")
        self._bar = progress_bar(total=self.total, initial=start_epoch * self.per_epoch, unit="step",
                                 desc=desc)
        try:
            yield from range(start_epoch, self.epochs_run)
        finally:
            self._bar.close()

    def batches(self, loader: Iterable[Any]) -> Iterator[tuple[int, Any]]:
        """(step, batch) for one epoch, cut at the steps per epoch; timed; the bar advances after each
        step."""
        self.losses, start = [], time.perf_counter()
        for step, batch in enumerate(loader):
            if step == self.per_epoch:
                break
            yield step, batch
            if self._bar is not None:
                self._bar.update()
        self._seconds = time.perf_counter() - start

    def record(self, loss: float) -> None:
        """A step's loss: kept for the epoch's mean, shown beside rank 0's bar."""
        self.losses.append(loss)
        if self._bar is not None:
            self._bar.set_postfix(refresh=False, loss=loss)

    def figures(self) -> dict[str, float]:
        """The last epoch's training speed (images/s, all workers) and this worker's peak GPU memory (MB)."""
        import torch

        device = worker_device()
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
        return {"images_per_s": len(self.losses) * self.batch_size / self._seconds, "peak_gpu_mb": peak}


def evaluate(model: Any, shard: Any, loss_fn: Any, autocast: Mapping[str, Any],
             batch_size: int = 256) -> dict[str, float]:
    """Validation accuracy and loss over every worker's shard of the validation set (all-reduced: the same
    figures on every rank). Every rank must call it."""
    import torch
    import torch.distributed as dist

    device = worker_device()
    model.eval()
    counts = torch.zeros(3, dtype=torch.float64, device=device)  # correct, seen, summed loss
    with torch.no_grad():
        for batch in shard.iter_torch_batches(batch_size=batch_size, device=device):
            with torch.autocast(**autocast):
                logits = model(batch["image"]).float()
            counts += torch.stack([(logits.argmax(1) == batch["label"]).sum().double(),
                                   torch.tensor(len(batch["label"]), dtype=torch.float64, device=device),
                                   loss_fn(logits, batch["label"]).double() * len(batch["label"])])
    dist.all_reduce(counts)
    return {"val_loss": (counts[2] / counts[1]).item(), "val_accuracy": (counts[0] / counts[1]).item()}


def mean_over_workers(values: list[float]) -> float:
    """The mean of each worker's mean (the workers ran the same number of steps). Every rank must call it."""
    import numpy as np
    import torch
    import torch.distributed as dist

    total = torch.tensor([np.mean(values)], dtype=torch.float64, device=worker_device())
    dist.all_reduce(total)
    return total.item() / dist.get_world_size()


def restored_state(start_epoch: int, scores: Mapping[str, float], scheduler: Any,
                   optimizer: Any) -> dict[str, Any]:
    """What a restarted worker group found in the checkpoint, before any further step: the epoch it resumes
    from, the restored weights' validation scores, the schedule's step and the momentum buffers."""
    buffers = sum("momentum_buffer" in s for s in optimizer.state.values())
    return {"resumed_from_epoch": start_epoch, "restored_val_accuracy": scores["val_accuracy"],
            "restored_val_loss": scores["val_loss"], "restored_schedule_step": scheduler.last_epoch,
            "restored_momentum_buffers": buffers}


def lose_worker(epoch: int, step: int) -> None:
    """The crash demo: this worker ends at once (`os._exit`: no exception, no clean-up), like a lost
    machine."""
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    print(f"rank {rank}: lost in epoch {epoch + 1}, step {step}", flush=True)
    os._exit(1)


# Back in the kernel


def load_state(checkpoint: Any, device: Any = "cpu") -> dict[str, Any]:
    """The training state a worker saved in a Ray Train checkpoint (state.pt)."""
    import torch

    with checkpoint.as_directory() as folder:
        return torch.load(Path(folder) / "state.pt", map_location=device, weights_only=True)


def history_of(result: Any) -> Any:
    """The per-epoch history carried by the run's last checkpoint (so it spans a restart), by epoch."""
    import pandas as pd

    return pd.DataFrame(load_state(result.checkpoint)["history"]).set_index("epoch")


def rank_nodes(result: Any) -> list[str]:
    """The Ray node of each rank of the last worker group, in rank order."""
    return str(result.metrics["rank_nodes"]).split()


@dataclass
class ResumeEvidence:
    """What the restarted worker group found in the checkpoint, against what the run had before the crash.

    `before` and `restored` have the same keys: val_accuracy and val_loss (the resumed-from epoch's weights,
    as that epoch reported them / as the new group scored them), schedule_step (where the schedule stood at
    the end of that epoch / where the restored one stands) and momentum_buffers (one per parameter tensor /
    as many as the restored optimizer holds).
    """

    resumed_from: int               # the epoch of the checkpoint the new group started from
    resumed_epochs: list[int]       # the epochs the new group reported
    before: dict[str, float]
    restored: dict[str, float]

    @property
    def accuracy_gap(self) -> float:
        """|restored validation accuracy - the one reported before the crash|."""
        return abs(self.restored["val_accuracy"] - self.before["val_accuracy"])

    @property
    def loss_gap(self) -> float:
        """The same for the validation loss, relative to the loss reported before the crash."""
        return abs(self.restored["val_loss"] - self.before["val_loss"]) / self.before["val_loss"]

    @property
    def table(self) -> Any:
        """Before the crash and restored after the restart, side by side (a DataFrame)."""
        import pandas as pd

        def column(values: Mapping[str, float]) -> list[Any]:
            return [f"{values['val_accuracy']:.4f}", f"{values['val_loss']:.4f}",
                    int(values["schedule_step"]), int(values["momentum_buffers"])]

        return pd.DataFrame(
            {"before the crash": column(self.before), "restored after the restart": column(self.restored)},
            index=[f"validation accuracy (epoch {self.resumed_from} weights)", "validation loss",
                   "schedule step", "momentum buffers"])


def resume_evidence(result: Any, history: Any, config: Mapping[str, Any], model: Any) -> ResumeEvidence:
    """The proof that the restart restored the training state, from the run's reports (`result`).

    What a full restore gives back is computed here independently of the checkpoint: the schedule's step at
    the end of the resumed-from epoch (`EpochSteps(config)`), and one momentum buffer per parameter tensor of
    `model` (a fresh one of the trained architecture).
    """
    reports = result.metrics_dataframe   # every report of the run, from both worker groups
    restarted = reports[reports["resumed_from_epoch"] > 0]
    if restarted.empty:
        raise AssertionError("no worker group resumed from a checkpoint: the worker was not lost, or the run "
                             "was not restarted")
    first = restarted.iloc[0]
    epoch = int(first["resumed_from_epoch"])
    reported = history.loc[epoch]   # reported before the crash, carried by the checkpoint
    before = {"val_accuracy": float(reported["val_accuracy"]), "val_loss": float(reported["val_loss"]),
              "schedule_step": epoch * EpochSteps(config).per_epoch,
              "momentum_buffers": sum(1 for _ in model.parameters())}
    restored = {key: float(first[f"restored_{key}"]) for key in before}
    return ResumeEvidence(epoch, restarted["epoch"].astype(int).tolist(), before, restored)


def plot_curves(history: Any, resume: ResumeEvidence | None = None) -> Any:
    """The loss curves and the validation accuracy by epoch; with `resume`, the restart marked and the
    restored checkpoint's score (re-scored by the new worker group) drawn as a cross. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 3.5))
    history[["train_loss", "val_loss"]].plot(ax=ax_loss, marker="o", title="loss", logy=True)
    history["val_accuracy"].plot(ax=ax_acc, marker="o", title="validation accuracy", ylim=(0, 1))
    if resume is not None:
        for ax in (ax_loss, ax_acc):
            ax.axvline(resume.resumed_from + 0.5, color="red", linestyle="--",
                       label="worker killed, group restarted")
        ax_acc.plot([resume.resumed_from], [resume.restored["val_accuracy"]], "x", ms=12, color="k",
                    label="restored checkpoint, re-scored")
        ax_acc.legend()
    for ax in (ax_loss, ax_acc):
        ax.set_xlabel("epoch")
    plt.tight_layout()
    plt.show()
    return fig
