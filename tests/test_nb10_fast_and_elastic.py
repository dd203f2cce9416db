"""Notebook 10 refuses bad parameters before any process starts.

The defaults are nbval's run; the "Scaling up" set (the 10M model, 8 micro-batches, resumed on 1 and 4 ranks)
is its other-parameter run, in tests/test_scale_up.py. The notebook's own checks (accumulation parity,
all-reduce counts, resumed = uninterrupted) run inside those; tests/test_check_mutations.py proves that the
parity check catches an accumulation that forgets to divide the loss, and the all-reduce count a no_sync left
out or wrapped around only some of the micro-batches. On the two-node Ray cluster (make test-cluster), every
launch but the resumes, which stay on this machine, runs one rank per node.
"""

import pytest

from helpers import tracking
from tests.support import stream_text

pytestmark = pytest.mark.notebook


def test_bad_parameters_are_refused_before_any_launch(refusals, monkeypatch):
    monkeypatch.setenv(tracking.ENV_SWITCH, "off")   # the kernel's: a registry name needs tracking on
    found = refusals(
        "10_fast_and_elastic",
        dict(micro_batches=3),                        # 8 sequences a rank do not split into 3
        dict(resume_world_sizes="[1, 4]"),            # what -p gives for a list
        dict(resume_world_sizes=[1, 3]),              # 16 sequences do not split over 3 ranks
        dict(straggler_ms=-5),
        dict(steps=1),
        dict(register_as="byte-gpt"),                 # a registry name with tracking off
    )
    errors = [r.error for r in found]
    assert "micro_batches=3 does not divide" in errors[0]
    assert "use -y 'resume_world_sizes: [1, 4]'" in errors[1]
    assert "does not split over the 3 ranks of the resume on 3" in errors[2] and "multiple of 24" in errors[2]
    assert "straggler_ms=-5" in errors[3]
    assert "at least 2 steps" in errors[4]
    assert "tracking is off" in errors[5]
    assert all("[rank" not in r.output for r in found), "a process started before the refusal"
    assert {r.cell for r in found} == {found[0].cell}, "refused in different cells: some after expensive work"


@pytest.mark.cluster
def test_two_nodes(run_notebook, tmp_path, two_node_cluster):
    """cluster=<address>: the DDP runs, the profiled run and the elastic run on 2 ranks train one rank per
    node (traces and the checkpoint written from both nodes into output_dir); the resumes on 1 and 4 ranks
    run on this machine and continue the 2-node run's loss curve. 4 steps, compile off: every check of the
    notebook holds at any length."""
    output_dir = tmp_path / "run"
    nb, metrics = run_notebook("10_fast_and_elastic", processes=2, cluster=two_node_cluster.address,
                               max_steps=4, compile_model=False, profile_steps=1, output_dir=str(output_dir))
    out = stream_text(nb)
    assert metrics["nodes"] == 2
    assert "2 rank(s) ran on 2 node(s)" in out and "all checks passed" in out
    assert metrics["resume_max_abs_diff"] < 1e-3
    assert sorted(p.name for p in (output_dir / "traces").iterdir()) == ["rank0.json", "rank1.json"]
