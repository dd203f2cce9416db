"""Notebook 04 under papermill with parameters other than the stored defaults.

The defaults (2 CPU processes, the crash demo included) are covered by nbval over notebooks/. Here: one
process on a user's text (data_path), its trained model registered in MLflow and loaded by name in a fresh
process; the failure-and-resume path on its own on the two-node Ray cluster, capped at 12 steps; a
checkpoint folder the ranks cannot see refused before training (make test-cluster); and bad arguments
refused before any launch. The notebook's own assertions (well below the unigram baseline, FSDP == DDP,
resumed == uninterrupted, the measured model state per rank == helpers.memory_plan's plan, the loaded model
== the driver's evaluation) run inside it; a failing one fails the execution.
"""


import re

import pytest

from helpers import tracking
from tests.support import greedy_answers_by_name, stream_text

pytestmark = pytest.mark.notebook



@pytest.fixture(autouse=True)
def passive_openmp_threads(monkeypatch):
    """Sleeping, not spinning, OpenMP threads (inherited by the kernel and the ranks it launches).

    On a 2-core machine shared with other jobs, a process with 2 spinning OpenMP threads (processes=1)
    ran 13x slower than with 1 thread; with OMP_WAIT_POLICY=PASSIVE it is as fast as expected.
    """
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")


SMALL = dict(steps=60, checkpoint_every=20, parity_steps=2, eval_batches=2)


def test_one_process_on_user_text_registers_the_model(run_notebook, tmp_path, registry):
    """data_path: a folder of the user's text files (here, three standard-library packages copied out). With
    register_as and tracking on, the gathered model goes to the registry, and MLflow alone (another process,
    by name) gives the greedy next bytes the notebook's driver evaluation gave."""
    import shutil
    import sysconfig
    from pathlib import Path

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for package in ("email", "json", "http"):
        shutil.copytree(stdlib / package, tmp_path / "corpus" / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    nb, metrics = run_notebook("04_fsdp_transformer", processes=1, data_path=str(tmp_path / "corpus"),
                               fail_at_step=None, register_as="byte-gpt",
                               **dict(SMALL, steps=100, checkpoint_every=50))
    assert metrics["processes"] == 1
    assert metrics["val_bits_per_byte"] < metrics["unigram_bits_per_byte"] - 0.5
    assert metrics["parity_max_abs_diff"] < 1e-4
    out = stream_text(nb)
    assert "crash demo skipped" in out
    assert "[rank0] step  100" in out     # the rank's own lines reached the cell, prefixed
    assert metrics["logged_model_uri"] == "models:/byte-gpt/1"
    assert metrics["model_state_plan_max_rel_diff"] < 0.01
    answers = [int(a) for a in metrics["logged_model_answers"].split()]
    assert greedy_answers_by_name(registry, "models:/byte-gpt/1") == answers


def test_crash_and_resume_on_two_nodes(run_notebook, tmp_path, two_node_cluster):
    """On the two-node Ray cluster, one rank a node: FSDP2 trains and writes DCP checkpoints from both nodes;
    a rank dies at step 6, Ray Train restarts the group, which resumes from step 4 and matches the
    uninterrupted run.

    With activation checkpointing on: recomputing activations must not change a single loss. Capped at 12
    steps (of a 60-step schedule): the crash demo at the defaults is nbval's run.
    """
    ckpt = tmp_path / "ckpt"
    nb, metrics = run_notebook("04_fsdp_transformer", processes=2, cluster=two_node_cluster.address,
                               fail_at_step=6, output_dir=str(ckpt), activation_checkpointing=True,
                               **dict(SMALL, checkpoint_every=4, max_steps=12, eval_batches=1))
    out = stream_text(nb)
    assert metrics["nodes"] == 2 and "2 rank(s) ran on 2 node(s)" in out
    assert "[rank1] rank 1: simulated crash at step 6" in out
    assert "[rank0] attempt 1: resumed from step_000004" in out
    assert metrics["resume_max_abs_diff"] < 1e-5
    # Only complete checkpoints remain under their final names; the last two are kept (and no marker file).
    assert sorted(p.name for p in (ckpt / "main").iterdir()) == ["step_000008", "step_000012"]
    assert sorted(p.name for p in (ckpt / "crash_demo").iterdir()) == ["step_000008", "step_000010"]
    assert all((p / ".metadata").exists() for p in (ckpt / "main").iterdir())


@pytest.mark.cluster
def test_a_checkpoint_folder_a_rank_cannot_see_fails_before_training(run_notebook, tmp_path,
                                                                     two_node_cluster):
    """output_dir on a disk the other machines do not share: the ranks find the folder (or a folder of the
    same name) without the marker the notebook's process wrote into it, and the launch stops before training
    with a SharedStorageError naming the parameter. Simulated as tests/test_launch_ray.py does: both nodes
    share this disk, so a thread removes the marker as soon as the notebook's process writes it (Ray takes
    seconds to start the workers that check it)."""
    import threading

    from papermill.exceptions import PapermillExecutionError

    from helpers.shared_storage import MARKER_PREFIX

    main = tmp_path / "ckpt" / "main"
    done = threading.Event()

    def remove_markers():
        while not done.is_set():
            for marker in main.glob(f"{MARKER_PREFIX}*") if main.is_dir() else ():
                marker.unlink(missing_ok=True)
            done.wait(0.01)

    watcher = threading.Thread(target=remove_markers, daemon=True)
    watcher.start()
    try:
        with pytest.raises(PapermillExecutionError) as info:
            run_notebook("04_fsdp_transformer", processes=2, cluster=two_node_cluster.address,
                         fail_at_step=None, output_dir=str(tmp_path / "ckpt"),
                         **dict(SMALL, max_steps=4, checkpoint_every=2))
    finally:
        done.set()
        watcher.join()
    error = str(info.value)
    assert "SharedStorageError" in error
    assert re.search(r"rank \d on node [0-9a-f]{16,} cannot see the folder output_dir=\S*/ckpt/main "
                     r"that the notebook's process marked: .*storage every node reaches", error), error
    assert not list(main.glob("step_*")), "a rank trained (and checkpointed) before the check"


def test_bad_settings_are_refused_before_launch(refusals, monkeypatch):
    monkeypatch.setenv(tracking.ENV_SWITCH, "off")   # a registry name with tracking off is refused
    crash, preset, register = refusals("04_fsdp_transformer", dict(fail_at_step=5, checkpoint_every=25),
                                       dict(preset="100M"), dict(register_as="byte-gpt"))
    assert "before the first checkpoint" in crash.error
    # the presets come from helpers/models/gpt.py (shared with 10): the message lists what exists there
    assert "preset='100M' is not one of 'tiny', '10M'" in preset.error
    assert "tracking is off" in register.error and "set register_as=None" in register.error
    assert "[rank" not in crash.output + preset.output + register.output
