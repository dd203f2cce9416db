"""The gallery runner (helpers.gallery) and its MLflow tracking, on tiny synthetic notebooks.

One synthetic gallery run (two notebooks: the first fails, the second records metrics, a history and a
figure) is executed once per test session by `synthetic_run` and shared with tests/test_gallery_report.py.
Everything else here runs no kernel.
"""

from __future__ import annotations

import io
import json
import socket
import time
import warnings

import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell

from helpers import tracking
from helpers.gallery import __main__ as cli
from helpers.gallery import runner as gallery
from helpers.gallery.errors import USAGE_ERROR, GalleryError
from tests.support import make_notebooks, notebook_of


@pytest.fixture
def two_notebooks(tmp_path):
    return make_notebooks(tmp_path / "nbs")


# --- overrides and discovery (no kernel) ----------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("3", 3), ("2.5", 2.5), ("1e-3", 0.001), ("None", None), ("True", True), ("'01'", "01"),
    ("auto", "auto"), ("[1, 2]", [1, 2]), ("{'a': 1}", {"a": 1}), ("data/x.csv", "data/x.csv"),
])
def test_values_are_literals_else_strings(text, value):
    assert gallery._literal(text) == value


def test_global_and_notebook_specific_overrides(two_notebooks):
    nbs = gallery.discover([], two_notebooks)
    fails, ok = nbs
    # notebook-specific wins over global whatever the order; a global name goes only where declared
    got = gallery.parse_overrides(["01:n=7", "n=2", "scale=0.5", "label=run a"], nbs)
    assert got[fails] == {"n": 7}
    assert got[ok] == {"n": 2, "scale": 0.5, "label": "run a"}


@pytest.mark.parametrize("item, message", [
    ("bogus=1", "no selected notebook declares a parameter 'bogus'"),
    ("01_fails:scale=2", "01_fails has no parameter 'scale'"),
    ("n", "write NAME=VALUE"),
    ("03:n=1", "no single notebook matches '03'"),
])
def test_unknown_names_are_refused(two_notebooks, item, message):
    with pytest.raises(GalleryError, match=message):
        gallery.parse_overrides([item], gallery.discover([], two_notebooks))


def test_unknown_name_refused_before_anything_runs(two_notebooks, tmp_path, capsys):
    runs = tmp_path / "runs"
    status = cli.main(["--notebooks-dir", str(two_notebooks), "--runs-dir", str(runs),
                           "-p", "n=2", "-p", "bogus=1"])
    assert status == USAGE_ERROR and "error: -p 'bogus=1'" in capsys.readouterr().err
    assert not runs.exists(), "a run folder was created although the command line was refused"


def test_override_for_notebook_not_selected(two_notebooks):
    with pytest.raises(GalleryError, match="not among the notebooks selected"):
        gallery.parse_overrides(["02:n=1"], gallery.discover(["01"], two_notebooks))


def test_discovery_by_number_and_stem(two_notebooks):
    everything = gallery.discover([], two_notebooks)
    assert [p.name for p in everything] == ["01_fails.ipynb", "02_ok.ipynb"]  # sorted, numbered only
    assert gallery.discover(["02"], two_notebooks) == [two_notebooks / "02_ok.ipynb"]
    assert gallery.discover(["02_ok", "01"], two_notebooks) == [two_notebooks / "02_ok.ipynb",
                                                                two_notebooks / "01_fails.ipynb"]
    with pytest.raises(GalleryError, match="available: 01_fails, 02_ok"):
        gallery.discover(["9"], two_notebooks)


def test_list_runs_nothing(two_notebooks, tmp_path, capsys):
    runs = str(tmp_path / "r")
    assert cli.main(["--notebooks-dir", str(two_notebooks), "--runs-dir", runs, "--list"]) == 0
    assert "02_ok {'n': 3, 'scale': 1.0, 'label': 'x'}" in capsys.readouterr().out
    assert not (tmp_path / "r").exists()


def test_progress_lines(tmp_path):
    nb = notebook_of([new_markdown_cell("# t"), new_code_cell("x = 1\ny = 2"), new_code_cell("")])
    out = io.StringIO()
    progress = gallery.CellProgress("[1/1] t", stream=out, tty=False)
    progress.notebook_start(notebook=nb)
    for i, cell in enumerate(nb.cells):
        progress.cell_start(cell=cell, cell_index=i)
    (line,) = out.getvalue().splitlines()  # code cells with source only
    assert "[1/1] t cell 2/3" in line and line.endswith("x = 1")
    tty = io.StringIO()
    progress = gallery.CellProgress("t", stream=tty, tty=True)
    progress.notebook_start(notebook=nb)
    progress.cell_start(cell=nb.cells[1], cell_index=1)
    progress.close()
    assert tty.getvalue().startswith("\r\033[K") and "\n" not in tty.getvalue()


# --- one real run of the synthetic gallery ---------------------------------------------------------

def test_failing_notebook_does_not_stop_the_others(synthetic_run):
    assert synthetic_run["status"] == 1, "a failed notebook must make the exit status non-zero"
    summary = json.loads((synthetic_run["run_dir"] / "summary.json").read_text())
    fails, ok = summary["notebooks"]
    assert (fails["notebook"], fails["status"]) == ("01_fails", "failed")
    assert (ok["notebook"], ok["status"]) == ("02_ok", "passed"), "the notebook after the failing one ran"
    assert synthetic_run["seconds"] < 150, synthetic_run["seconds"]


def test_summary_contents(synthetic_run):
    run_dir = synthetic_run["run_dir"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run"] == run_dir.name and summary["host"]["cpus"] >= 1
    assert summary["tracking_uri"] == f"sqlite:///{run_dir.resolve()}/mlflow.db"
    fails, ok = summary["notebooks"]
    assert fails["parameters"] == {"n": 5} and fails["all_parameters"] == {"n": 5}
    assert fails["error"]["ename"] == "ValueError" and fails["error"]["evalue"] == "broken on purpose, n=5"
    assert fails["error"]["anchor"].startswith("cell-id=") and fails["metrics"] == {}
    assert ok["parameters"] == {"scale": 2.0}
    assert ok["all_parameters"] == {"n": 3, "scale": 2.0, "label": "x"}
    assert ok["metrics"] == {"score": 1.0, "final_loss": pytest.approx(1 / 3), "processes": 1,
                             "device": "cpu"}
    assert ok["error"] is None and ok["seconds"] > 0 and ok["host"]["gpus"] == 0
    for entry in (fails, ok):
        assert (run_dir / entry["output"]).exists() and (run_dir / entry["html"]).exists()
    assert ok["figure"] == "figures/02_ok.png" and (run_dir / ok["figure"]).stat().st_size > 1000
    md = (run_dir / "summary.md").read_text()
    assert "| [01_fails](notebooks/01_fails.html) | failed (ValueError in In [4]) |" in md
    assert "| [02_ok](notebooks/02_ok.html) | passed |" in md and "1 passed, 1 failed" in md


def test_runner_shows_notebook_and_cell(synthetic_run):
    out = synthetic_run["stdout"]
    assert "[1/2] 01_fails (n=5)" in out and "[2/2] 02_ok (scale=2.0)" in out
    assert "[2/2] 02_ok cell 4/" in out and "import matplotlib" in out  # which cell is running
    assert "failed in" in out and "ValueError: broken on purpose" in out


def test_one_mlflow_run_pernotebook_of(synthetic_run):
    from mlflow import MlflowClient

    run_dir = synthetic_run["run_dir"]
    client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
    runs = {r.data.tags["gallery.notebook"]: r for r in client.search_runs(
        [e.experiment_id for e in client.search_experiments()], f"tags.`gallery.run_id` = '{run_dir.name}'")}
    assert set(runs) == {"01_fails", "02_ok"}
    ok, fails = runs["02_ok"], runs["01_fails"]
    assert ok.info.status == "FINISHED" and fails.info.status == "FAILED"
    assert ok.data.params == {"n": "3", "scale": "2.0", "label": "x"}
    assert ok.data.metrics["score"] == 1.0 and ok.data.tags["metric.device"] == "cpu"
    assert [(m.step, m.value) for m in client.get_metric_history(ok.info.run_id, "loss")] == [
        (1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    artifacts = {a.path for a in client.list_artifacts(ok.info.run_id)}
    assert artifacts == {"02_ok.png", "02_ok.ipynb", "02_ok.html"}
    assert fails.data.params == {"n": "5"} and "broken on purpose" in fails.data.tags["gallery.error"]
    # artifacts went next to the store, not into the notebooks' working directory
    assert (run_dir / "mlartifacts").is_dir() and not (synthetic_run["notebooks"] / "mlruns").exists()


# --- tracking without the runner (in this process, no kernel) ----------------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_tracking_server_warns_once_and_carries_on(monkeypatch):
    from helpers import record_metrics

    tracking._import_mlflow()  # the import itself is not what this test times
    uri = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv(tracking.ENV_SWITCH, "on")
    monkeypatch.setenv(tracking.ENV_URI, uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setattr(tracking, "_failed_uris", set())
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert record_metrics(accuracy=0.9, params={"a": 1}) == {"accuracy": 0.9}
        assert record_metrics(accuracy=0.8) == {"accuracy": 0.8}
    assert time.perf_counter() - start < 10
    ours = [w for w in caught if issubclass(w.category, tracking.TrackingWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert uri in str(ours[0].message) and "GALLERY_TRACKING=off" in str(ours[0].message)


def test_record_metrics_logs_dataframe_history_on_rank_zero_only(monkeypatch, tmp_path):
    import pandas as pd
    from mlflow import MlflowClient

    from helpers import record_metrics

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv(tracking.ENV_SWITCH, "on")
    monkeypatch.setenv(tracking.ENV_URI, uri)
    monkeypatch.setenv(tracking.ENV_NOTEBOOK, "99_test")
    monkeypatch.delenv(tracking.ENV_RUN_DIR, raising=False)
    history = pd.DataFrame({"epoch": [1, 2], "loss": [2.0, 1.0], "accuracy": [0.5, 0.75]}).set_index("epoch")
    monkeypatch.setenv("RANK", "1")  # inside a worker: nothing is tracked
    record_metrics(accuracy=0.75, history=history)
    assert not (tmp_path / "mlflow.db").exists()
    monkeypatch.delenv("RANK")
    with pytest.warns(tracking.TrackingWarning, match="could not store the figure"):
        record_metrics(accuracy=0.75, history=history, params={"lr": 0.1, "data_dir": None, "size(max)": 3},
                       figure=object())  # a figure MLflow cannot save: warned, the run is kept
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("99_test").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "data_dir": "None", "size_max_": "3"}
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.0)]
    # the final value is logged at the last step, so MLflow's "latest" is the headline metric
    assert run.data.metrics == {"loss": 1.0, "accuracy": 0.75}
    monkeypatch.setenv(tracking.ENV_SWITCH, "off")
    record_metrics(accuracy=0.1)
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_record_metrics_adds_to_the_notebooks_own_mlflow_run(monkeypatch, tmp_path):
    """A notebook whose training logged to MLflow itself (Lightning's MLFlowLogger) stays one MLflow run."""
    from mlflow import MlflowClient

    from helpers import record_metrics

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv(tracking.ENV_SWITCH, "on")
    monkeypatch.setenv(tracking.ENV_RUN_ID, "run-42")
    monkeypatch.setenv(tracking.ENV_NOTEBOOK, "98_own_run")
    assert tracking.resolve_tracking_uri(uri) == uri
    client = tracking.client_for(uri)
    own = client.create_run(client.create_experiment("98_own_run"))
    client.log_param(own.info.run_id, "lr", "0.01")
    for step, loss in enumerate([2.0, 1.0]):
        client.log_metric(own.info.run_id, "train_loss", loss, step=step)
    client.set_terminated(own.info.run_id)
    record_metrics(recall=0.3, params={"lr": 0.01, "epochs": 2}, tracking_uri=uri,
                   mlflow_run_id=own.info.run_id,
                   history=[{"epoch": 1, "train_loss": 9.0}, {"epoch": 2, "train_loss": 9.0, "val": 0.5}])
    (run,) = MlflowClient(uri).search_runs([own.info.experiment_id])
    assert run.info.run_id == own.info.run_id and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.01", "epochs": "2"} and run.data.tags["gallery.run_id"] == "run-42"
    assert run.data.metrics == {"train_loss": 1.0, "val": 0.5, "recall": 0.3}  # its own losses kept


def test_a_run_whose_logging_fails_ends_failed_and_warns(monkeypatch, tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv(tracking.ENV_SWITCH, "on")
    monkeypatch.setattr(tracking, "_failed_uris", set())
    with pytest.warns(tracking.TrackingWarning, match="failed"):
        info = tracking.log_notebook_run(metrics={"accuracy": 0.5, "device": "cpu"}, tracking_uri=uri,
                                         notebook="97_failing", artifacts=[tmp_path / "missing.html"])
    assert info is None
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("97_failing").experiment_id])
    assert run.info.status == "FAILED" and run.data.metrics == {"accuracy": 0.5}
    assert run.data.tags["metric.device"] == "cpu" and run.data.tags["gallery.notebook"] == "97_failing"
