"""Notebook 10 refuses bad parameters before any process starts.

The defaults are nbval's run; the "Scaling up" set (the 10M model, 8 micro-batches, resumed on 1 and 4 ranks)
is its other-parameter run, in tests/test_scale_up.py. The notebook's own checks (accumulation parity,
all-reduce counts, resumed = uninterrupted) run inside those; tests/test_check_mutations.py proves that the
parity check catches an accumulation that forgets to divide the loss, and the all-reduce count a no_sync left
out or wrapped around only some of the micro-batches.
"""

import pytest

from helpers import tracking

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
