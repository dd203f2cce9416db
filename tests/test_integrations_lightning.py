"""What a lesson's Lightning `Trainer` needs around it (helpers/integrations/lightning.py): the quieting, the
fit record, the MLflow store its ranks log into, and the proof that 2 DDP ranks step as 1 accumulating
process. The progress bar is tested with the other bars, in tests/test_progress.py."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import torch

from helpers.integrations.lightning import (
    MLflowStore,
    ddp_matches_accumulation,
    fit_record,
    mlflow_store,
    quiet_lightning,
    show_logged_run,
)


def test_quiet_lightning_filters_what_a_reader_cannot_act_on():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_lightning()
        quiet_lightning()   # twice: one log filter, not two
        from lightning.fabric.utilities.warnings import PossibleUserWarning

        warnings.warn("IProgress not found. Please update jupyter and ipywidgets.", stacklevel=1)
        warnings.warn("The number of training batches (3) is smaller than the logging interval",
                      PossibleUserWarning, stacklevel=1)
        warnings.warn("something a reader should see", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something a reader should see"]
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    assert len([f for f in rank_zero.filters if type(f).__name__ == "_NoAdverts"]) == 1
    advert = logging.LogRecord("x", logging.INFO, "", 0, "💡 Tip: try litlogger for ...", None, None)
    assert not rank_zero.filters[-1].filter(advert)


class _Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"row": torch.tensor(i), "x": torch.tensor([float(i)])}


def _module():
    import lightning as L

    class Linear(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            loss = (self.layer(batch["x"]) ** 2).mean()
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Linear()


def test_fit_record_keeps_epochs_the_last_epochs_rows_and_what_ran(tmp_path):
    import lightning as L

    quiet_lightning()
    record = fit_record(["train_loss"], sample_key="row")
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[record],
                        default_root_dir=tmp_path)
    loader = torch.utils.data.DataLoader(_Rows(), batch_size=4, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    trainer.fit(_module(), train_dataloaders=loader)
    result = record.result(trainer)
    assert [row["epoch"] for row in result["history"]] == [1, 2]
    assert result["history"][1]["train_loss"] < result["history"][0]["train_loss"]
    assert sorted(result["samples"].tolist()) == list(range(12)), "the last epoch's rows, each once"
    assert result["steps"] == 6 and result["seconds"] > 0
    assert result["strategy"] == "SingleDeviceStrategy" and result["environment"] is None
    assert result["peak_gpu_mb"] is None


def test_mlflow_store_off_and_on(tmp_path, monkeypatch):
    monkeypatch.setenv("GALLERY_TRACKING", "off")
    assert mlflow_store(f"sqlite:///{tmp_path}/ignored.db", "x") == MLflowStore(None, None)
    assert not (tmp_path / "ignored.db").exists()
    monkeypatch.setenv("GALLERY_TRACKING", "on")
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    store = mlflow_store(uri, "03_test")
    assert store.uri == uri and store.folder == str(tmp_path / "store")
    from helpers import tracking

    assert tracking.client_for(uri).get_experiment_by_name("03_test") is not None, "created in the kernel"


def test_show_logged_run(tmp_path, monkeypatch, capsys):
    assert show_logged_run(None, None, "val_recall_at_10") is None
    assert "nothing was logged" in capsys.readouterr().out
    monkeypatch.setenv("GALLERY_TRACKING", "on")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    from helpers import tracking

    client = tracking.client_for(uri)
    run = client.create_run(tracking.create_experiment("03_test", uri), run_name="2xcpu")
    for step, value in enumerate([0.2, 0.3, 0.35]):
        client.log_metric(run.info.run_id, "val_recall_at_10", value, step=step)
    client.log_param(run.info.run_id, "lr", "0.01")
    logged = show_logged_run(uri, run.info.run_id, "val_recall_at_10")
    assert logged.values == [0.2, 0.3, 0.35] and logged.name == "2xcpu" and logged.params == {"lr": "0.01"}
    assert "MLflow holds 3 values of val_recall_at_10" in capsys.readouterr().out


def _pairs(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((n, 3)), rng.standard_normal(n)
    return {"x": x.astype(np.float32), "y": y.astype(np.float32)}


def _regression(scale_by_world: bool):
    import lightning as L

    class Regression(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            loss = ((self.layer(batch["x"]).squeeze(1) - batch["y"]) ** 2).mean()
            return loss * self.trainer.world_size if scale_by_world else loss   # the bug: a sum, not a mean

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters())   # replaced by SGD in the comparison

    return Regression()


@pytest.mark.parametrize("summed", [False, True], ids=["averaged", "summed"])
def test_ddp_matches_accumulation_and_catches_a_sum(summed):
    parity = ddp_matches_accumulation(lambda: _regression(summed), _pairs(32), batch_size=8, steps=3, lr=0.1,
                                      seed=0)
    assert list(parity.table.columns) == ["2 DDP ranks", "1 process, 2 accumulated halves"]
    assert list(parity.table.index) == [1, 2, 3]
    if summed:
        assert parity.max_diff > 0.1, parity.table
    else:
        assert parity.max_diff < 1e-6, parity.table


def test_ddp_matches_accumulation_refuses_an_odd_batch():
    with pytest.raises(ValueError, match="even batch size"):
        ddp_matches_accumulation(lambda: None, _pairs(8), batch_size=3, steps=1, lr=0.1, seed=0)
