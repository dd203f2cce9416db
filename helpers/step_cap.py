"""The `max_steps` parameter every notebook shares: a cap on training, for quick test runs.

A test that runs a notebook at its full-size parameters (the "scaling up" commands, on stand-in data) must
not train for hours: `max_steps` caps it to a few optimizer steps *in all*, whatever `epochs` says. The run
keeps its shape (several epochs when the cap allows, evaluation after each, checkpoints), only shorter:
`min(epochs, max_steps)` epochs of `ceil(max_steps / epochs_run)` steps. `None` means the full run, the one
whose results the notebook's bars and reference check judge.
"""

from __future__ import annotations

import math


def check_max_steps(max_steps: int | None, minimum: int = 1) -> None:
    """On the driver, before anything runs: a cap that is not a whole number >= `minimum` fails, saying so."""
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                  or max_steps < minimum):
        raise ValueError(f"max_steps={max_steps!r}: set a whole number of steps >= {minimum}, or None for "
                         "the full run.")


def cap_steps(epochs: int, steps_per_epoch: int, max_steps: int | None) -> tuple[int, int]:
    """(epochs to run, steps in each): all of them without a cap, else at most `max_steps` steps in all."""
    if max_steps is None:
        return epochs, steps_per_epoch
    epochs_run = max(1, min(epochs, max_steps))
    return epochs_run, max(1, min(steps_per_epoch, math.ceil(max_steps / epochs_run)))
