"""Rank 0's progress bar: carried to the launching process and drawn there, never in a worker's log.

The kernel path (a real Jupyter server, display updated in place) is covered in test_interactive_jupyter.py;
Ray's relay in test_launch_ray.py. Here: the local launcher's file channel, the switches, the Jupyter
display rendering, the Lightning and transformers adapters, and the stored notebooks (every bar sits in a
cell nbval does not compare).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

import helpers.progress
from helpers import LaunchError, distributed, progress_bar, worker_context
from helpers.integrations.lightning import lightning_progress_bar
from helpers.integrations.transformers import transformers_progress_callback
from helpers.progress import PROGRESS_METADATA_KEY, ProgressView, format_bar
from tests.support import RecordingView

ROOT = Path(__file__).resolve().parent.parent


@distributed(processes=2, device="cpu")
def _steps(n: int, delay: float) -> dict:
    ctx = worker_context()
    bar = progress_bar(total=n, desc=f"rank {ctx.rank} steps", unit="step")
    for i in range(n):
        time.sleep(delay)
        bar.set_postfix(loss=1.0 / (i + 1))
        bar.update()
        print(f"step {i} rank {ctx.rank}", flush=True)
    bar.close()
    return {"finished": time.monotonic(), "sink": type(bar._sink).__name__,
            "switch": os.environ.get("GALLERY_PROGRESS"), "dir": os.environ.get("GALLERY_PROGRESS_DIR")}


def test_rank0_bar_is_drawn_live_by_the_launching_process(recording_view, capfd):
    results = _steps.distributed(12, 0.1)
    out = capfd.readouterr().out
    states = [s for _, s in recording_view.drawn]
    assert states, "no bar state reached the launching process"
    assert {s["desc"] for s in states} == {"rank 0 steps"}, "only rank 0's bar is drawn"
    assert len({s["id"] for s in states}) == 1
    final = states[-1]
    assert final["n"] == final["total"] == 12 and final["closed"], final
    assert final["postfix"] == "loss=0.08333", final
    assert any(0 < s["n"] < 12 for s in states), f"no state between start and end: {states}"
    first_live = next(t for t, s in recording_view.drawn if 0 < s["n"] < 12)
    assert results[0]["finished"] - first_live > 0.3, "the bar only moved when the ranks had finished"
    assert recording_view.closed
    assert results[0]["sink"] == "_FileSink" and results[1]["sink"] == "NoneType"
    assert "\r" not in out and "steps" not in out, "a bar leaked into the ranks' log"
    assert "[rank0] step 11 rank 0" in out and "[rank1] step 11 rank 1" in out


def test_no_bar_anywhere_when_progress_is_off(recording_view):
    results = _steps.options(progress=False).distributed(3, 0.0)
    assert recording_view.drawn == []
    for r in results:  # rank 0 must not fall back to tqdm in its own log either
        assert r["sink"] == "NoneType" and r["switch"] == "off" and r["dir"] is None, r


def test_environment_switch_off_wins(monkeypatch):
    monkeypatch.setenv("GALLERY_PROGRESS", "off")
    assert helpers.progress.progress_view() is None and helpers.progress.progress_view(True) is None
    monkeypatch.setenv("GALLERY_PROGRESS", "on")
    assert helpers.progress.progress_view().mode == "terminal"
    monkeypatch.delenv("GALLERY_PROGRESS")
    assert helpers.progress.progress_view() is None, "pytest's stderr is no terminal: automatic means off"


def test_bad_progress_settings_fail_before_any_process(monkeypatch):
    with pytest.raises(LaunchError, match="progress='yes'"):
        _steps.options(progress="yes").distributed(1, 0.0)
    monkeypatch.setenv("GALLERY_PROGRESS", "maybe")
    with pytest.raises(LaunchError, match="GALLERY_PROGRESS='maybe'.*'on' or 'off'"):
        _steps.distributed(1, 0.0)


def test_other_ranks_pass_the_iterable_through_untouched():
    bar = progress_bar(iter(range(4)), total=4, rank=1)
    assert list(bar) == [0, 1, 2, 3] and bar.id == "" and bar._sink is None
    with pytest.raises(TypeError, match="update"):
        list(progress_bar(total=3, rank=1))


def test_in_process_call_draws_in_this_process(monkeypatch):
    view = RecordingView()
    monkeypatch.setattr(helpers.progress.view, "progress_view", lambda enabled=None: view)
    for _ in progress_bar(range(5), desc="local"):
        pass
    assert view.drawn[-1][1]["n"] == 5 and view.drawn[-1][1]["closed"]
    resumed = progress_bar(total=10, initial=6, desc="resumed")
    resumed.update(4)
    resumed.close()
    state = view.drawn[-1][1]
    assert state["n"] == 10 and state["initial"] == 6
    assert "4.00it/s" in format_bar(dict(state, elapsed=1.0)), "the rate counts only the steps since resuming"


def test_jupyter_display_is_one_output_updated_in_place(monkeypatch):
    calls = []

    class Handle:
        def update(self, data, raw, metadata):
            calls.append(("update", data, metadata))

    def display(data, raw, metadata, display_id):
        calls.append(("display", data, metadata))
        return Handle()

    import IPython.display

    monkeypatch.setattr(IPython.display, "display", display)
    view = ProgressView("display")
    base = {"id": "1:1", "desc": "epoch 1/3", "total": 10, "unit": "batch", "postfix": "", "closed": False}
    view.show(dict(base, n=0, elapsed=0.0))
    view.show(dict(base, n=5, elapsed=1.0, postfix="loss=0.5"))
    view.show(dict(base, n=5, elapsed=1.0, postfix="loss=0.5"))  # unchanged: not redrawn
    view.show(dict(base, n=10, elapsed=2.0, closed=True))
    view.show(dict(base, n=3, elapsed=3.0))  # late state of a closed bar: ignored
    assert [kind for kind, _, _ in calls] == ["display", "update", "update"]
    kind, data, metadata = calls[-1]
    assert "epoch 1/3: 100%" in data["text/plain"] and "10/10" in data["text/plain"], data
    assert '<progress value="10" max="10"' in data["text/html"]
    assert metadata[PROGRESS_METADATA_KEY] == {"id": "1:1", "n": 10, "total": 10, "closed": True}
    assert "loss=0.5" in calls[1][1]["text/plain"]
    assert format_bar(dict(base, n=3, total=None, elapsed=1.0)).startswith("epoch 1/3: 3batch"), "no total"


def test_lightning_adapter_reports_each_epoch(monkeypatch, tmp_path):
    import lightning as L
    import torch

    view = RecordingView()
    monkeypatch.setattr(helpers.progress.view, "progress_view", lambda enabled=None: view)

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(28, 4)), batch_size=4)
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[lightning_progress_bar()])
    trainer.fit(Tiny(), data)
    finals = [s for _, s in view.drawn if s["closed"]]
    assert [s["desc"] for s in finals] == ["epoch 1/2", "epoch 2/2"]
    assert all(s["n"] == s["total"] == 7 for s in finals) and "train_loss=" in finals[-1]["postfix"], finals


def test_transformers_adapter_follows_the_optimiser_steps(monkeypatch):
    view = RecordingView()
    monkeypatch.setattr(helpers.progress.view, "progress_view", lambda enabled=None: view)
    callback = transformers_progress_callback("ZeRO-2")
    state = SimpleNamespace(max_steps=6, global_step=0, is_world_process_zero=True)
    callback.on_train_begin(None, state, None)
    for step in range(1, 7):
        state.global_step = step
        callback.on_step_end(None, state, None)
        if step % 3 == 0:
            callback.on_log(None, state, None, logs={"loss": 1.0 / step})
    callback.on_train_end(None, state, None)
    final = view.drawn[-1][1]
    assert final["desc"] == "ZeRO-2" and final["n"] == final["total"] == 6 and final["closed"]
    assert final["postfix"] == "loss=0.1667", final
    other = transformers_progress_callback()
    other.on_train_begin(None, SimpleNamespace(max_steps=6, is_world_process_zero=False), None)
    assert other._bar._sink is None, "only the main process draws"


NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_notebook_bars_sit_where_nbval_does_not_compare(path):
    """Each notebook trains with a rank-0 bar, and every bar is in a cell tagged nbval-ignore-output."""
    nb = nbformat.read(path, as_version=4)
    bars = []
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            state = output.get("metadata", {}).get(PROGRESS_METADATA_KEY)
            if state is None:
                continue
            assert "nbval-ignore-output" in cell.metadata.get("tags", []), (
                f"cell {index} of {path.name} shows a progress bar but nbval would compare it: "
                "tag the cell nbval-ignore-output")
            bars.append(state)
    assert bars, f"{path.name} was stored without a training progress bar"
    # (a bar of a rank killed on purpose, in 04 and 06, stays where it stopped; the run's final one is full)
    assert any(s["closed"] and s["total"] and s["n"] == s["total"] for s in bars), bars
