"""Shared fixtures: run a notebook with papermill, refuse bad inputs, record progress bars, one synthetic
gallery run per session. What tests share besides fixtures is in tests/support.py."""

from __future__ import annotations

import contextlib
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

import helpers.progress
from helpers import tracking
from helpers.env import temporary_environ
from helpers.gallery import __main__ as cli
from helpers.gallery.execute import execute_notebook
from helpers.gallery.notebook_io import read_metrics
from tests.browser import browser  # noqa: F401  (a fixture: a headless chromium)
from tests.support import LIVE_CLUSTERS, RecordingView, make_notebooks, notebook_path


@pytest.fixture
def run_notebook(tmp_path):
    """run_notebook('01_ddp_mlp', processes=1) -> (executed notebook, recorded metrics)."""

    def run(stem: str, **parameters: Any) -> tuple[nbformat.NotebookNode, dict[str, Any]]:
        out = tmp_path / f"{stem}-out.ipynb"
        nb = execute_notebook(notebook_path(stem), out, parameters, timeout=900)
        return nb, read_metrics(nb)

    return run


@pytest.fixture(scope="session")
def two_node_cluster():
    """A simulated Ray cluster of two nodes with one CPU each, on this machine: what a notebook's `cluster`
    parameter joins in its two-node test (the address), and the launcher's own two-node tests. One per test
    process (xdist worker), started when a test first asks for it.

    Each node gets 512 MiB of object store (Ray's test cluster gives 150 MiB): a notebook's arguments (01's
    arrays, 02's images) travel through it.
    """
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "object_store_memory": 512 << 20})
    try:
        cluster.add_node(num_cpus=1, object_store_memory=512 << 20)
        cluster.wait_for_nodes()
        LIVE_CLUSTERS.append(cluster)
        yield cluster
    finally:
        if cluster in LIVE_CLUSTERS:
            LIVE_CLUSTERS.remove(cluster)
        cluster.shutdown()


@dataclass
class Refusal:
    """How the notebook stopped on one bad parameter set: the exception ("ValueError: ..."), everything the
    cells printed before it, and the index of the cell that raised."""

    error: str
    output: str
    cell: int   # index of the cell that raised, in the notebook as stored


@dataclass
class BadSftInputs:
    model_without_tokenizer: Path   # a model folder (config.json) with no tokenizer files
    alpaca_jsonl: Path              # another dataset format: instruction / output, no chat messages


@pytest.fixture
def registry(tmp_path, monkeypatch) -> str:
    """Tracking on, into a SQLite store of this test's own (nbval and make test run with tracking off)."""
    store = tracking.sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv(tracking.ENV_SWITCH, "on")
    monkeypatch.setenv(tracking.ENV_URI, store)
    return store


@pytest.fixture
def bad_sft_inputs(tmp_path) -> BadSftInputs:
    """The user inputs every fine-tuning notebook (08, 09) must refuse before any launch."""
    import json

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    alpaca = tmp_path / "alpaca.jsonl"
    alpaca.write_text(json.dumps({"instruction": "reverse: abc", "input": "", "output": "cba"}) + "\n")
    return BadSftInputs(tmp_path / "model", alpaca)


NO_FORKSERVER_HEAD_START = "import helpers.launch._compat as _c; _c.start_forkserver = lambda: None; del _c"


@pytest.fixture
def refusals():
    """refusals('05_deepspeed_zero_sft', {"zero_stage": 4}, {...}) -> one Refusal per parameter set.

    Each set runs the notebook's code cells, with the set injected after the parameters cell as papermill
    injects it, until a cell raises; a set the notebook runs to the end fails the test. The sets share one
    kernel, as a user in Jupyter who fixes a parameter and runs the cells again: the cells are re-run from
    the parameters cell down, so every name is redefined, and the imports are paid once (a papermill run
    per set started a kernel and imported torch, DeepSpeed or transformers each time, 20-30 s apiece).
    """
    from nbclient import NotebookClient
    from papermill.translators import translate_parameters

    from helpers.gallery.execute import KERNEL_NAME, check_parameters

    def run(stem: str | Path, *cases: dict[str, Any]) -> list[Refusal]:
        path = stem if isinstance(stem, Path) else notebook_path(stem)
        for case in cases:
            check_parameters(path, case)
        nb = nbformat.read(str(path), as_version=4)
        first = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
        defaults = nb.cells[first].source   # read now: the client writes each executed cell into `nb`
        code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code" and i > first]
        # allow_errors: a raising cell leaves its error among its outputs (read below) instead of raising
        # here, and the same kernel goes on with the next set.
        client = NotebookClient(nb, kernel_name=KERNEL_NAME, timeout=900, allow_errors=True,
                                resources={"metadata": {"path": str(path.parent)}},
                                extra_arguments=["--IPKernelApp.log_level=ERROR"])
        found: list[Refusal] = []
        with client.setup_kernel():
            # A refusal launches nothing: the import cell's preload(...) need not start the forkserver, which
            # imports DeepSpeed, TRL or Unsloth beside the other test worker and costs CPU time the refusal
            # never uses. A set that launched would start it then.
            client.execute_cell(nbformat.v4.new_code_cell(NO_FORKSERVER_HEAD_START), 0)
            for case in cases:
                injected = translate_parameters(KERNEL_NAME, "python", case, "Injected parameters")
                cells = [(first, defaults), (first, injected), *code]
                printed: list[str] = []
                for index, source in cells:
                    cell = nbformat.v4.new_code_cell(source)
                    client.execute_cell(cell, index)
                    printed += [o.get("text", "") for o in cell.outputs if o.output_type == "stream"]
                    errors = [o for o in cell.outputs if o.output_type == "error"]
                    if errors:
                        error = f"{errors[0].ename}: {errors[0].evalue}"
                        found.append(Refusal(error=error, output="".join(printed), cell=index))
                        break
                else:
                    pytest.fail(f"{stem} ran to the end with {case}: nothing refused it")
        return found

    return run


@pytest.fixture
def recording_view(monkeypatch):
    view = RecordingView()
    monkeypatch.setattr(helpers.progress.view, "progress_view",
                        lambda enabled=None: None if enabled is False else view)
    return view


_RUN: dict = {}


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory):
    """Run the synthetic gallery once: {"run_dir", "status", "stdout", "seconds"}."""
    if not _RUN:
        base = tmp_path_factory.mktemp("synthetic-gallery")
        notebooks = make_notebooks(base / "notebooks")
        out = io.StringIO()
        start = time.perf_counter()
        # tracking on even where the test command turns it off for the notebooks (GALLERY_TRACKING=off)
        tracking_on = {tracking.ENV_SWITCH: "on", tracking.ENV_URI: None, "MLFLOW_TRACKING_URI": None}
        with contextlib.redirect_stdout(out), temporary_environ(tracking_on):
            status = cli.main(["--notebooks-dir", str(notebooks), "--runs-dir", str(base / "runs"),
                                   "-p", "scale=2.0", "-p", "01_fails:n=5", "--timeout", "120"])
        (run_dir,) = (base / "runs").iterdir()
        _RUN.update(run_dir=run_dir, status=status, stdout=out.getvalue(),
                    seconds=time.perf_counter() - start, notebooks=notebooks)
    return _RUN
