"""Notebook 00, the launcher's tour: what nbval, which runs it at its defaults, does not cover.

Each section of the notebook asserts what it shows (one result per rank, the all_reduce sum, the rank's own
exception, the attempt after a restart, the in-process call, the Ray run), so nbval's execution is the test of
the tour itself. Here: bad parameters are refused before anything is launched, the notebook's map of the
gallery, like the README's table, lists every other notebook, and (make test-cluster) the whole tour runs on
the two-node Ray cluster.
"""

from __future__ import annotations

import re

import nbformat
import pytest

from tests.support import NOTEBOOKS, notebook_path

STEM = "00_getting_started"
MAP_HEADING = "## Where to go next"


def _map_links(source: str) -> list[str]:
    """The notebooks the map's table links, in its order."""
    return re.findall(r"^\| \[[^\]]+\]\((\d\d_\w+)\.ipynb\)", source, re.M)


def _map_cell() -> str:
    cells = [c.source for c in nbformat.read(str(notebook_path(STEM)), as_version=4).cells
             if c.cell_type == "markdown" and c.source.startswith(MAP_HEADING)]
    assert len(cells) == 1, f"{STEM}: expected one '{MAP_HEADING}' section, found {len(cells)}"
    return cells[0]


def test_the_map_links_every_other_notebook_in_order():
    others = [p.stem for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) if p.stem != STEM]
    assert _map_links(_map_cell()) == others, (
        f"{STEM}'s '{MAP_HEADING}' table should link {others}, one row each, in order")
    assert "(../docs/launcher.md)" in _map_cell(), "the map should link the launcher's page"


def test_the_map_check_can_fail():
    table = "|---|---|\n| [01 DDP](01_ddp_mlp.ipynb) | x |\n| [03 L](03_lightning.ipynb) | y |\n"
    assert _map_links(table) == ["01_ddp_mlp", "03_lightning"]
    assert _map_links(table.replace("(01_ddp_mlp.ipynb)", "(01_ddp_mlp.md)")) == ["03_lightning"]


@pytest.mark.notebook
def test_bad_parameters_are_refused_before_any_launch(refusals):
    """A step cap of 0 and a loop of no steps: each fails with a message naming the fix, and no rank ran."""
    zero_cap, no_steps = refusals(STEM, {"max_steps": 0}, {"steps": 0})
    assert "max_steps=0: set a whole number of steps" in zero_cap.error
    assert no_steps.error == "ValueError: steps=0: use a whole number of 1 or more."
    assert "[rank" not in zero_cap.output + no_steps.output   # nothing was launched


@pytest.mark.notebook
@pytest.mark.cluster
def test_the_tour_runs_on_a_two_node_cluster(run_notebook, two_node_cluster):
    """Every launch of the tour on the two-node Ray cluster (one rank per node): the sections assert what they
    show there too (the all_reduce sum, the failing rank's own exception, the restarted group, the in-process
    call), and the ranks ran on both nodes."""
    _, metrics = run_notebook(STEM, cluster=two_node_cluster.address, max_steps=5)
    assert metrics["nodes"] == 2
    assert metrics["processes"] == 2
