"""Launching from a real Jupyter kernel (nbclient): rank output lands in the cell, rank errors are cell
errors."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbformat.v4 import new_code_cell, new_notebook

KERNELSPEC = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
CELLS = [
    "from helpers import distributed, worker_context\nimport os",
    # a class and a closure defined in the notebook, used inside the ranks
    "class Greeting:\n    def __init__(self, word):\n        self.word = word\n"
    "greeting = Greeting('hello')\n"
    "@distributed(processes=2)\n"
    "def hello(n):\n"
    "    ctx = worker_context()\n"
    "    for i in range(n):\n"
    "        print(f'{greeting.word} {i} from rank {ctx.rank}', flush=True)\n"
    "    return ctx.rank\n",
    "results = hello.distributed(3)\nprint('results', results)",
    "results2 = hello.distributed(1)\nprint('again', results2)",
    "@distributed(processes=2)\n"
    "def broken():\n"
    "    if os.environ['RANK'] == '1':\n"
    "        raise ValueError('bad shard on rank one')\n"
    "broken.distributed()",
]


def _run(cells):
    nb = new_notebook(cells=[new_code_cell(c) for c in cells], metadata=KERNELSPEC)
    client = NotebookClient(nb, kernel_name="python3", timeout=120, allow_errors=True)
    client.execute()
    return nb


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def test_rank_output_and_errors_in_cells():
    nb = _run(CELLS)
    launch = _text(nb.cells[2])
    for rank in (0, 1):
        for i in range(3):
            assert f"[rank{rank}] hello {i} from rank {rank}\n" in launch
    assert "results [0, 1]" in launch
    assert "again [0, 1]" in _text(nb.cells[3])

    errors = [o for o in nb.cells[4].outputs if o.output_type == "error"]
    assert len(errors) == 1
    assert errors[0].ename == "ValueError"
    assert "rank 1 of 2" in errors[0].evalue and "bad shard on rank one" in errors[0].evalue


def test_papermill_style_failure_is_raised():
    """Without allow_errors (as papermill and nbval run), the rank's error stops the notebook."""
    nb = new_notebook(cells=[new_code_cell(CELLS[0]), new_code_cell(CELLS[4])], metadata=KERNELSPEC)
    client = NotebookClient(nb, kernel_name="python3", timeout=120)
    try:
        client.execute()
    except CellExecutionError as e:
        assert "ValueError" in str(e) and "rank 1 of 2" in str(e)
    else:
        raise AssertionError("the rank's ValueError did not fail the notebook")
    assert isinstance(nb, nbformat.NotebookNode)
