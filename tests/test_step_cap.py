"""The shared `max_steps` cap: few steps in all, whatever `epochs` says; bad caps refused with the fix."""

import pytest

from helpers.step_cap import cap_steps, check_max_steps


@pytest.mark.parametrize("epochs, per_epoch, cap, expected", [
    (20, 22, None, (20, 22)),   # the full run
    (26, 1800, 2, (2, 1)),      # COCO-sized epochs: two epochs of one step, not 26
    (4, 69, 10, (4, 3)),        # several epochs, a few steps each (at most cap + epochs - 1 in all)
    (1, 22, 20, (1, 20)),       # one epoch: the cap is its length
    (3, 5, 100, (3, 5)),        # a cap above the run: the run
])
def test_cap(epochs, per_epoch, cap, expected):
    assert cap_steps(epochs, per_epoch, cap) == expected
    run_epochs, steps = cap_steps(epochs, per_epoch, cap)
    if cap is not None:
        assert run_epochs * steps < cap + run_epochs


@pytest.mark.parametrize("bad", [0, -1, 2.5, "10", True])
def test_bad_caps(bad):
    with pytest.raises(ValueError, match="set a whole number of steps >= 1"):
        check_max_steps(bad)
    check_max_steps(None)
    check_max_steps(3)
    with pytest.raises(ValueError, match=">= 3"):
        check_max_steps(2, minimum=3)
