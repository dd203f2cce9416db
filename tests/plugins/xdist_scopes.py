"""pytest-xdist plugin: which tests may run at the same time on two workers.

Every test gets a group, and a group runs on one worker, start to end:

* its file, by default. nbval's cells of one notebook share one kernel, so a notebook cannot be spread
  over workers (spread, 72 cells failed); and a test file's module fixtures then run once.
* itself, for each notebook's scale-up run (tests/test_scale_up.py::test_NN_...): a minute or two each on
  2 cores, they share no fixture, and as one file they made a 12-minute group that finished alone.
* `streaming`, for every test that runs MosaicML Streaming's `StreamingDataset` (notebook 03, its tests,
  its scale-up run, the MDS round trips). Streaming keeps its state in shared memory named by machine-wide
  prefixes, and `clean_stale_shared_memory()`, which a test of the MovieLens data calls as Streaming
  advises, unlinks every segment of every prefix, including those of a run in progress on the other worker
  (notebook 03 itself calls `helpers.integrations.streaming`, which spares live runs). Such runs must not
  overlap.

The longest groups are handed out first (Streaming's, about 3 minutes on 2 cores; then the notebooks, the
scale-up runs and the test files that run notebooks, a minute or two each; then the rest, seconds each), so
that no long group starts last, on one worker, while the other has nothing left to do. Loaded with
`-p tests.plugins.xdist_scopes` (the Makefile does it whenever it runs the tests on more than one worker).

Private API (checked against pytest-xdist 3.8.0 with pytest 9.2.0; tests/test_compat.py resolves each):
`xdist.scheduler.LoadScopeScheduling._split_scope`, the method that maps a node id to its scope, and the
option `loadscopereorder`, which `--dist loadscope` reads. xdist documents neither as API. If one moves,
run without the plugin (TEST_WORKERS=0: one process, no xdist) until it is updated.
"""

from __future__ import annotations

import re

import pytest

STREAMING = "streaming"
# Node ids of the tests that run StreamingDataset (tests/test_xdist_scopes.py checks the list stays whole)
STREAMING_TESTS = (
    "notebooks/03_lightning_two_tower_mds.ipynb::",
    "tests/test_nb03_lightning_two_tower_mds.py::",
    "tests/test_scale_up.py::test_03_",
    "tests/test_data_movielens.py::",
    "tests/test_integrations_streaming.py::",
    "tests/test_check_mutations.py::test_the_check_catches_the_bug[03_",
)


# (module, attribute path) of each private name used here, for tests/test_compat.py
PRIVATE_API = (("xdist.scheduler", "LoadScopeScheduling._split_scope"),
               ("xdist.scheduler", "LoadScopeScheduling"))

SCALE_UP_RUN = re.compile(r"tests/test_scale_up\.py::test_\d\d_")


def group_of(nodeid: str) -> str:
    """A test's group: `streaming` for Streaming's users, itself for a scale-up run, else its file."""
    if nodeid.startswith(STREAMING_TESTS):
        return STREAMING
    if SCALE_UP_RUN.match(nodeid):
        return nodeid
    return nodeid.split("::", 1)[0]


# Test files that run notebooks or launch many ranks: a minute or more each, like a notebook
LONG_FILES = re.compile(r"tests/(test_nb\d\d_\w+|test_llm_memory|test_model_registry|test_launch_ray)\.py$")


def start_order(group: str) -> int:
    """Groups with a lower number are handed out first: the longest ones."""
    if group == STREAMING:
        return 0
    long = group.startswith("notebooks/") or SCALE_UP_RUN.match(group) or LONG_FILES.match(group)
    return 1 if long else 2


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which would make the scheduler of --dist
def pytest_xdist_make_scheduler(config, log):
    """xdist's scheduler by scope, with our groups as the scopes, handed out in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    # (xdist's own way, `--dist loadgroup` with xdist_group marks, writes the group into the node id, which
    # pytest 9 no longer lets a plugin change: each test became a group, and notebooks lost their kernel;
    # pytest-dev/pytest-xdist#1386, open, with xdist 3.8.0 and pytest 9.2.0)
    config.option.loadscopereorder = False  # keep the order below, not xdist's (most tests first)
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    # groups are handed out in the order they are first collected; a stable sort keeps each one's order
    items.sort(key=lambda item: start_order(group_of(item.nodeid)))
