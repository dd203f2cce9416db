"""Tests that run Streaming never share the machine with each other on two workers
(tests/plugins/xdist_scopes.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.plugins.xdist_scopes import STREAMING, group_of

ROOT = Path(__file__).resolve().parents[1]
# What in a test's source says it runs StreamingDataset or cleans Streaming's shared memory
USES_STREAMING = re.compile(
    r"StreamingDataset|clean_stale_shared_memory|clean_streaming_leftovers"
    r"|(?:run_notebook|refusals|_run_parameters)\(\s*[\"']03_")


def streaming_tests_outside_the_group(test_files: list[Path], root: Path) -> list[str]:
    """Node ids of test functions in `test_files` that use Streaming but would run outside its group."""
    found = []
    for path in test_files:
        source = path.read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                nodeid = f"{path.relative_to(root).as_posix()}::{node.name}"
                if USES_STREAMING.search(ast.get_source_segment(source, node) or "") \
                        and group_of(nodeid) != STREAMING:
                    found.append(nodeid)
    return found


def test_every_test_that_runs_streaming_is_in_its_group():
    files = sorted(p for p in (ROOT / "tests").glob("test_*.py") if p.name != Path(__file__).name)
    assert streaming_tests_outside_the_group(files, ROOT) == [], (
        "these tests run Streaming: add them to STREAMING_TESTS in tests/plugins/xdist_scopes.py")
    assert group_of("notebooks/03_lightning_two_tower_mds.ipynb::Cell 11") == STREAMING
    mutation = "tests/test_check_mutations.py::test_the_check_catches_the_bug[03_lightning_two_tower_mds: x]"
    assert group_of(mutation) == STREAMING


def test_a_new_streaming_test_outside_the_group_is_caught(tmp_path):
    (tmp_path / "tests").mkdir()
    new = tmp_path / "tests" / "test_new.py"
    new.write_text("def test_reads_shards(tmp_path):\n    from streaming import StreamingDataset\n\n"
                   "def test_other():\n    assert True\n")
    assert streaming_tests_outside_the_group([new], tmp_path) == ["tests/test_new.py::test_reads_shards"]


def test_other_tests_are_grouped_by_their_file():
    """A notebook's cells share one kernel, so they must stay on one worker; other files keep theirs too."""
    assert group_of("notebooks/02_ddp_retinanet.ipynb::Cell 6") == "notebooks/02_ddp_retinanet.ipynb"
    assert group_of("tests/test_scale_up.py::test_a_drifted_command_is_caught") == "tests/test_scale_up.py"


def test_each_scale_up_run_is_a_group_of_its_own():
    run = "tests/test_scale_up.py::test_02_scale_up_resnet50_on_coco_sized_jpegs"
    assert group_of(run) == run


def test_the_longest_groups_start_first():
    from tests.plugins.xdist_scopes import start_order

    run = "tests/test_scale_up.py::test_02_scale_up_resnet50_on_coco_sized_jpegs"
    # a test file that runs notebooks goes with them: started last, it would run alone on one worker
    nb04 = "tests/test_nb04_fsdp_transformer.py"
    groups = ["tests/test_launch_local.py", nb04, "notebooks/02_x.ipynb", run, STREAMING]
    assert sorted(groups, key=start_order) == [STREAMING, nb04, "notebooks/02_x.ipynb", run,
                                               "tests/test_launch_local.py"]


def test_two_workers_keep_each_group_on_one_worker(tmp_path):
    """A real two-worker run of a small suite: each file on one worker, Streaming's files together.

    xdist's own `--dist loadgroup` fails this on pytest 9 (pytest-dev/pytest-xdist#1386): it spread the
    cells of a notebook over both workers.
    """
    import json
    import os
    import subprocess
    import sys

    tests = tmp_path / "tests"
    tests.mkdir()
    body = ("import json, os\n\n" + "".join(
        f"def test_{i}():\n    with open({str(tmp_path / 'ran.jsonl')!r}, 'a') as f:\n"
        f"        f.write(json.dumps([__name__, os.environ['PYTEST_XDIST_WORKER']]) + '\\n')\n\n"
        for i in range(6)))
    for name in ("test_data_movielens", "test_nb03_lightning_two_tower_mds", "test_a", "test_b", "test_c"):
        (tests / f"{name}.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                           "--dist", "loadscope", "-p", "tests.plugins.xdist_scopes", "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = {}
    for module, worker in map(json.loads, (tmp_path / "ran.jsonl").read_text().splitlines()):
        workers.setdefault(module, set()).add(worker)
    assert all(len(w) == 1 for w in workers.values()) and len(workers) == 5, workers
    assert workers["test_data_movielens"] == workers["test_nb03_lightning_two_tower_mds"], workers
    assert len(set().union(*workers.values())) == 2, f"both workers should have had work: {workers}"

