"""Notebook 06's Ray Train helpers (helpers.integrations.ray_train) and its data helpers (fashion_idx.locate
and the figures), without starting Ray: the settings check of the crash demo, the run's length and figures,
the validation and loss all-reduced over two gloo ranks, the resume's evidence, the marks and the folder
check. The notebook's own tests run them inside Ray Train workers."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import matplotlib
import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.data import fashion_idx
from helpers.integrations import ray_train

matplotlib.use("agg")
CONFIG = {"epochs": 3, "n_train": 1024, "batch_size": 64, "max_steps": None}


@pytest.mark.parametrize("fail_at_epoch,epochs,max_steps,message", [
    (1, 3, None, "must be None or between 2 and epochs=3"),
    (4, 3, None, "must be None or between 2 and epochs=3"),
    (True, 3, None, "must be None or between 2"),
    (2.0, 3, None, "must be None or between 2"),
    (2, 3, 5, "max_steps caps the run to a few steps"),
])
def test_the_crash_demo_needs_a_checkpoint_first(fail_at_epoch, epochs, max_steps, message):
    with pytest.raises(ValueError, match=message):
        ray_train.check_fail_at_epoch(fail_at_epoch, epochs, max_steps)
    ray_train.check_fail_at_epoch(None, 3, 5)
    ray_train.check_fail_at_epoch(2, 3, None)
    ray_train.check_fail_at_epoch(3, 3, None)


def test_quiet_ray_keeps_what_the_user_set(monkeypatch):
    monkeypatch.setattr("helpers.launch.ray_instance.import_ray", lambda: None)   # no Ray import needed here
    for name in ray_train.RAY_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_DEDUP_LOGS", "1")
    ray_train.quiet_ray()
    assert os.environ["RAY_DEDUP_LOGS"] == "1"
    health = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
    assert os.environ[health] == ray_train.RAY_SETTINGS[health]


def test_epoch_steps_cut_time_and_record(monkeypatch):
    monkeypatch.setattr(ray_train, "worker_device", lambda: torch.device("cpu"))
    steps = ray_train.EpochSteps(CONFIG)
    assert (steps.epochs_run, steps.per_epoch, steps.total) == (3, 16, 48)
    assert list(steps.epochs(1)) == [1, 2]   # a group resumed after epoch 1 runs epochs 2 and 3 (0-based)
    seen = []
    for step, batch in steps.batches(iter(range(100))):   # a loader longer than an epoch is cut
        seen.append((step, batch))
        steps.record(float(step))
    assert seen == [(i, i) for i in range(16)] and steps.losses == [float(i) for i in range(16)]
    figures = steps.figures()
    assert figures["peak_gpu_mb"] == 0.0 and figures["images_per_s"] > 0
    list(steps.batches(iter(range(3))))   # a new epoch starts with no losses
    assert steps.losses == []
    capped = ray_train.EpochSteps(dict(CONFIG, max_steps=4))
    assert (capped.epochs_run, capped.per_epoch) == (3, 2)


def _rank(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ray_train.worker_device = lambda: torch.device("cpu")
        model, images, labels = _model_and_data()
        shard = _Shard(images[rank::world], labels[rank::world])   # unequal shards: 7 and 6 images
        scores = ray_train.evaluate(model, shard, torch.nn.CrossEntropyLoss(), {"device_type": "cpu",
                                                                              "enabled": False}, batch_size=4)
        losses = [1.0, 2.0, 3.0] if rank == 0 else [4.0]
        out[rank] = {**scores, "train_loss": ray_train.mean_over_workers(losses)}
    finally:
        dist.destroy_process_group()


class _Shard:
    """What a worker's Ray Dataset shard offers the evaluation: iter_torch_batches."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        self.images, self.labels = images, labels

    def iter_torch_batches(self, batch_size: int, device: torch.device):
        for i in range(0, len(self.labels), batch_size):
            yield {"image": self.images[i:i + batch_size].to(device), "label": self.labels[i:i + batch_size]}


def _model_and_data() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 3))
    return model, torch.randn(13, 1, 4, 4), torch.randint(0, 3, (13,))


def test_the_validation_of_two_workers_is_the_whole_set_s():
    from helpers.launch.local import free_port

    model, images, labels = _model_and_data()
    with torch.no_grad():
        logits = model(images)
    accuracy = (logits.argmax(1) == labels).double().mean().item()
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank, args=(2, free_port(), out), nprocs=2, start_method="spawn")
        out = dict(out)
    assert out[0] == out[1], "every rank gets the same all-reduced figures"
    assert out[0]["val_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert out[0]["val_loss"] == pytest.approx(loss, rel=1e-6)
    assert out[0]["train_loss"] == 3.0   # the mean of the workers' means: (2 + 4) / 2


def _run_reports(restored_accuracy: float = 0.5) -> tuple[SimpleNamespace, pd.DataFrame]:
    history = pd.DataFrame([{"epoch": e, "val_accuracy": a, "val_loss": v, "train_loss": t}
                            for e, a, v, t in [(1, 0.5, 2.0, 1.5), (2, 0.7, 1.0, 0.9), (3, 0.9, 0.3, 0.4)]])
    nan = ray_train.NOT_RESUMED
    reports = pd.DataFrame([
        {"epoch": 1, **nan},
        {"epoch": 2, "resumed_from_epoch": 1, "restored_val_accuracy": restored_accuracy,
         "restored_val_loss": 2.0, "restored_schedule_step": 16, "restored_momentum_buffers": 2},
        {"epoch": 3, "resumed_from_epoch": 1, "restored_val_accuracy": restored_accuracy,
         "restored_val_loss": 2.0, "restored_schedule_step": 16, "restored_momentum_buffers": 2},
    ])
    return SimpleNamespace(metrics_dataframe=reports), history.set_index("epoch")


def test_the_resume_evidence_compares_the_restored_state_with_the_run_before_the_crash():
    result, history = _run_reports()
    model = torch.nn.Linear(3, 2)   # two parameter tensors: two momentum buffers expected
    resume = ray_train.resume_evidence(result, history, CONFIG, model)
    assert (resume.resumed_from, resume.resumed_epochs) == (1, [2, 3])
    assert resume.before == {"val_accuracy": 0.5, "val_loss": 2.0, "schedule_step": 16, "momentum_buffers": 2}
    assert resume.restored == resume.before and resume.accuracy_gap == 0 and resume.loss_gap == 0
    assert resume.table.shape == (4, 2) and resume.table.iloc[2].tolist() == [16, 16]
    # a restore that gave back other weights shows as a gap; a run that never restarted has no evidence
    assert ray_train.resume_evidence(*_run_reports(0.1), CONFIG, model).accuracy_gap == pytest.approx(0.4)
    result.metrics_dataframe = result.metrics_dataframe.iloc[:1]
    with pytest.raises(AssertionError, match="no worker group resumed"):
        ray_train.resume_evidence(result, history, CONFIG, model)


def test_restored_state_counts_what_the_optimizer_and_schedule_got_back():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
    fresh = ray_train.restored_state(1, {"val_accuracy": 0.5, "val_loss": 1.0}, scheduler, optimizer)
    assert (fresh["restored_schedule_step"], fresh["restored_momentum_buffers"]) == (0, 0)
    for _ in range(3):
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
    state = ray_train.restored_state(1, {"val_accuracy": 0.5, "val_loss": 1.0}, scheduler, optimizer)
    assert (state["restored_schedule_step"], state["restored_momentum_buffers"]) == (3, 2)
    assert set(state) == set(ray_train.NOT_RESUMED)   # the same columns in every report of the run


def test_the_curves_mark_the_restart():
    result, history = _run_reports()
    plain = ray_train.plot_curves(history)
    marked = ray_train.plot_curves(history, ray_train.resume_evidence(result, history, CONFIG,
                                                                      torch.nn.Linear(3, 2)))
    assert len(plain.axes) == len(marked.axes) == 2
    assert plain.axes[1].get_legend() is None
    assert [t.get_text() for t in marked.axes[1].get_legend().get_texts()] == [
        "val_accuracy", "worker killed, group restarted", "restored checkpoint, re-scored"]


def test_a_session_marks_local_folders_only(tmp_path):
    import contextlib

    session = object.__new__(ray_train.RaySession)   # its marks, without starting Ray
    session._stack = contextlib.ExitStack()
    shared = session.mark(output_dir=str(tmp_path / "out"), bucket="s3://bucket/runs", none=None)
    assert [item.name for item in shared.paths] == ["output_dir"]
    assert shared.check() == {"output_dir": str(tmp_path / "out")}
    session.close()
    assert not list((tmp_path / "out").iterdir()), "the mark is removed when the session closes"


def test_the_timed_block_gives_its_seconds(monkeypatch):
    monkeypatch.setenv("GALLERY_PROGRESS", "off")
    with ray_train.timed() as clock:
        assert math.isnan(clock.seconds)
    assert clock.seconds >= 0


@pytest.fixture(scope="module")
def fashion(tmp_path_factory):
    return fashion_idx.build(tmp_path_factory.mktemp("fm"), train_size=40, test_size=20, seed=1)


def test_locate_checks_the_folder_and_its_counts(fashion, tmp_path):
    assert fashion_idx.locate(fashion, 40, 20) == fashion
    assert fashion_idx.idx_count(fashion / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte") == 20
    with pytest.raises(ValueError, match=r"n_train \+ n_val = 41 exceeds the 40 train images"):
        fashion_idx.locate(fashion, 41, 20)
    with pytest.raises(ValueError, match="n_test = 21 exceeds the 20 test images"):
        fashion_idx.locate(fashion, 40, 21)
    with pytest.raises(FileNotFoundError, match="has no FashionMNIST/raw/train-images-idx3-ubyte"):
        fashion_idx.locate(tmp_path, 40, 20)
    (tmp_path / "not-idx").write_bytes(b"PK\x03\x04zip!")
    with pytest.raises(ValueError, match="not an IDX file"):
        fashion_idx.idx_count(tmp_path / "not-idx")


def test_the_figures_draw(fashion, monkeypatch):
    import matplotlib.pyplot as plt
    import torchvision

    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    test = torchvision.datasets.FashionMNIST(fashion, train=False, download=False)
    images, labels = test.data.numpy(), test.targets.numpy()
    fashion_idx.show_examples(images, labels)
    predictions = np.where(np.arange(len(labels)) % 2 == 0, labels, (labels + 1) % 10)
    fashion_idx.show_predictions(images, labels, predictions)
    assert len(shown) == 2
    assert shown[1].axes[0].get_title() == "test accuracy 0.500"
