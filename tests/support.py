"""What several test files share (no test file imports another): the notebooks' places, readers of executed
notebooks' outputs, synthetic gallery notebooks, a progress view that records, and a real 1-CPU cgroup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from helpers.gallery.catalog import CATALOG
from helpers.progress import ProgressView

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# The notebooks that train no model (the launcher's tour), from the catalog. Every other notebook trains one,
# and so takes `precision`, checks its result against reference runs (notebooks/references/) and has a GPU
# check; the tests that hold notebooks to those rules take them from training_notebooks().
TRAINS_NOTHING = frozenset(nb.stem for nb in CATALOG if not nb.trains)


# The two-node Ray clusters this test process started (tests/conftest.py's `two_node_cluster`), so that the
# tests which look for Ray processes left behind can tell the cluster's own from a launch's.
LIVE_CLUSTERS: list[Any] = []


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


# Synthetic gallery notebooks (tests/test_gallery_runner.py, tests/test_gallery_report.py)

OK_CODE = """import matplotlib
matplotlib.use("agg")
import matplotlib.pyplot as plt
from helpers import record_metrics
fig, ax = plt.subplots(figsize=(3, 2))
ax.plot([1.0 / (i + 1) for i in range(n)], marker="o")
ax.set_title(f"loss, {label}")
plt.show()
print("n is", n)"""
OK_RECORD = """record_metrics(score=0.5 * scale, final_loss=1.0 / n, processes=1, device="cpu",
               params=dict(n=n, scale=scale, label=label),
               history=[{"epoch": i + 1, "loss": 1.0 / (i + 1)} for i in range(n)], figure=fig)"""


def notebook_of(cells: list) -> nbformat.NotebookNode:
    return new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


def make_notebooks(folder: Path) -> Path:
    """01_fails (raises in its third code cell) and 02_ok (records metrics, a history and a figure)."""
    folder.mkdir(parents=True, exist_ok=True)
    fails = notebook_of([
        new_markdown_cell("# Fails on purpose"),
        new_code_cell("n = 1", metadata={"tags": ["parameters"]}),
        new_code_cell("x = n + 1\nprint('x is', x)"),
        new_code_cell("raise ValueError(f'broken on purpose, n={n}')"),
        new_code_cell("print('never reached')"),
    ])
    ok = notebook_of([
        new_markdown_cell("# Passes"),
        new_code_cell("n = 3\nscale = 1.0\nlabel = 'x'", metadata={"tags": ["parameters"]}),
        new_code_cell(OK_CODE),
        new_code_cell(OK_RECORD, metadata={"tags": ["nbval-ignore-output"]}),
    ])
    nbformat.write(fails, str(folder / "01_fails.ipynb"))
    nbformat.write(ok, str(folder / "02_ok.ipynb"))
    nbformat.write(notebook_of([new_code_cell("1")]), str(folder / "scratch.ipynb"))  # not numbered: ignored
    return folder


class RecordingView(ProgressView):
    """A terminal view that records what it would draw instead of drawing it."""

    def __init__(self) -> None:
        super().__init__("terminal")
        self.drawn: list[tuple[float, dict]] = []
        self.closed = False

    def _show_in_terminal(self, key: str, state: dict) -> None:
        self.drawn.append((time.monotonic(), state))

    def close(self) -> None:
        self.closed = True


# A real cgroup with a quota of 1 CPU (tests/test_cpus.py, benchmarks/cpu_quota.py)

CGROUPS = ((Path("/sys/fs/cgroup/cpu"), "cpu.cfs_quota_us", {"cpu.cfs_quota_us": "100000"}),   # v1
           (Path("/sys/fs/cgroup"), "cgroup.controllers", {"cpu.max": "100000 100000"}))     # v2


def one_cpu_cgroup() -> Path | None:
    """A new real cgroup with a quota of 1 CPU, or None where none can be made (not root, no cpu controller).
    The caller removes it (rmdir) once its processes have ended."""
    for base, marker, files in CGROUPS:
        if not (base / marker).exists():   # not this kind of hierarchy (a plain folder would take the files)
            continue
        group = base / f"helpers-quota-{uuid.uuid4().hex[:8]}"
        try:
            group.mkdir()
            for name, value in files.items():
                (group / name).write_text(value)
            return group
        except OSError:
            if group.exists():
                group.rmdir()
    return None


def join(group: Path) -> None:
    """Move this process into `group` (a subprocess's preexec_fn)."""
    (group / "cgroup.procs").write_text(str(os.getpid()))


# A third process: MLflow's pyfunc loader and the registry, nothing of the notebook or of helpers
_GREEDY_BY_NAME = textwrap.dedent("""
    import json, sys
    import mlflow
    import numpy as np

    mlflow.set_tracking_uri(sys.argv[1])
    model = mlflow.pyfunc.load_model(sys.argv[2])
    outputs = np.asarray(model.predict(model.input_example))
    print(json.dumps(outputs.argmax(-1).ravel().tolist()))
""")


def greedy_answers_by_name(store: str, uri: str) -> list[int]:
    """A registered model's answers for its own input example (the argmax over its last axis: a class, a
    next token), from a fresh process that has MLflow and the registry and nothing else."""
    done = subprocess.run([sys.executable, "-c", _GREEDY_BY_NAME, store, uri], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# The same for a language model: MLflow's transformers loader gives the model and its tokenizer back, and the
# logged input example (prompts in the chat template) is answered greedily, with the logged model_config where
# the notebook logged one (else the built-in tasks' longest answer, 4 letters, + 2 tokens)
_TEXT_BY_NAME = textwrap.dedent("""
    import json, sys
    import mlflow
    import mlflow.pyfunc
    import mlflow.transformers
    import torch
    from mlflow.models import Model

    mlflow.set_tracking_uri(sys.argv[1])
    folder = mlflow.artifacts.download_artifacts(sys.argv[2])
    logged = Model.load(folder)
    prompts = logged.load_input_example(folder)
    prompts = list(prompts.iloc[:, 0]) if hasattr(prompts, "iloc") else list(prompts)
    generation = logged.flavors["python_function"].get(mlflow.pyfunc.MODEL_CONFIG) or {
        "max_new_tokens": 6, "do_sample": False}
    parts = mlflow.transformers.load_model(folder, return_type="components")
    model, tokenizer = parts["model"].eval(), parts["tokenizer"]
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        # only what every causal LM's forward takes: a plain tokenizer also returns token_type_ids
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             **generation, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id)
    answers = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    print(json.dumps([a.strip() for a in answers]))
""")


def text_answers_by_name(store: str, uri: str) -> list[str]:
    """A registered language model's greedy answers to its own input example, from a fresh process that has
    MLflow, transformers and the registry, and nothing of the notebook, helpers, Unsloth or PEFT."""
    done = subprocess.run([sys.executable, "-c", _TEXT_BY_NAME, store, uri], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
