"""Shared fixtures: run a notebook with papermill into a temporary folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest

from helpers.execute import execute_notebook, read_metrics

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# The notebooks that train no model: the launcher's tour. Every other notebook trains one, and so takes
# `precision`, checks its result against reference runs (notebooks/references/) and has a GPU check
# (tools/gpu_check.py); the tests that hold notebooks to those rules take them from training_notebooks().
TRAINS_NOTHING = frozenset({"00_getting_started"})


def training_notebooks() -> list[Path]:
    """Every notebook in notebooks/ that trains a model, in name order (all but TRAINS_NOTHING)."""
    return [p for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) if p.stem not in TRAINS_NOTHING]


def notebook_path(stem: str) -> Path:
    path = NOTEBOOKS / f"{stem}.ipynb"
    assert path.exists(), f"no notebook {path}"
    return path


def stream_text(nb: nbformat.NotebookNode, name: str | None = None) -> str:
    """All stream output of the executed notebook (stdout and stderr, or one of them)."""
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.get("output_type") == "stream" and (name is None or out.get("name") == name)
    )


def display_text(nb: nbformat.NotebookNode) -> str:
    """The text/plain of every display and result (where record_metrics and the reference check write)."""
    return "\n".join(
        out.get("data", {}).get("text/plain", "")
        for cell in nb.cells
        for out in cell.get("outputs", [])
        if out.get("output_type") in ("display_data", "execute_result")
    )


@pytest.fixture
def run_notebook(tmp_path):
    """run_notebook('01_ddp_mlp', processes=1) -> (executed notebook, recorded metrics)."""

    def run(stem: str, **parameters: Any) -> tuple[nbformat.NotebookNode, dict[str, Any]]:
        out = tmp_path / f"{stem}-out.ipynb"
        nb = execute_notebook(notebook_path(stem), out, parameters, timeout=900)
        return nb, read_metrics(nb)

    return run



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

    from helpers.execute import KERNEL_NAME, check_parameters

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
            # imports DeepSpeed, TRL or Unsloth beside the other test worker (05's, 07's and 08's refusal
            # tests: 49-54 busy CPU-seconds with it, 39-41 without). A set that launched would start it then.
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
