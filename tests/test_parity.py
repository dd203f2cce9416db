"""helpers.parity: the 1-vs-N comparison of the data-parallel lessons (01, 02), with a stand-in launcher."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from helpers.launch import LaunchPlan
from helpers.parity import Parity, compare_processes, comparison_launch


@dataclass
class FakeLaunch:
    """A `@distributed` function: `.options(...)`, then `.distributed(*args)`; it records the launches."""

    curve: dict[int, list[float]]          # processes -> rank 0's losses
    launches: list[dict] = field(default_factory=list)
    chosen: dict = field(default_factory=dict)

    def options(self, **changes):
        return FakeLaunch(self.curve, self.launches, changes)

    def distributed(self, *args):
        self.launches.append(dict(self.chosen, args=args))
        return [{"step_losses": self.curve[self.chosen["processes"]]}, {"step_losses": []}]


def test_where_the_comparison_runs():
    assert comparison_launch(LaunchPlan(4, "cuda", "nccl")) == (4, "cuda")   # every GPU of the plan
    assert comparison_launch(LaunchPlan(1, "cuda", "nccl")) == (2, "cpu")    # two ranks may not share a GPU
    assert comparison_launch(LaunchPlan(2, "cpu", "gloo")) == (2, "cpu")
    assert comparison_launch(None) == (2, "cpu")


def test_same_arguments_on_1_and_N_processes():
    fn = FakeLaunch({1: [2.0, 1.0, 0.5], 4: [2.0, 1.0000001, 0.5000002]})
    parity = compare_processes(fn, {"lr": 0.1}, "data", plan=LaunchPlan(4, "cuda", "nccl"), key="step_losses",
                               batch_size=64, threads_per_process=1)
    assert [(x["processes"], x["device"], x["threads_per_process"]) for x in fn.launches] == [
        (1, "cuda", 1), (4, "cuda", 1)]
    assert all(x["args"] == ({"lr": 0.1}, "data") for x in fn.launches)
    assert parity.processes == 4 and parity.steps == 3
    assert parity.max_diff == pytest.approx(2e-7)
    assert parity.summary(below=1e-3) == "largest loss difference over 3 steps, 1 vs 4 processes: below 0.001"


def test_a_drift_is_shown_and_measured():
    """What a summed reduction looks like: the curves part from the second step; the summary shows the gap."""
    parity = Parity([2.0, 1.0, 0.5, 0.4], [2.0, 1.5, 0.9, 0.8], 2, "cpu")
    assert parity.max_diff == pytest.approx(0.5)
    assert parity.summary(below=1e-3).endswith("1 vs 2 processes: 0.5")
    table = parity.table()
    assert list(table.columns) == ["1 process", "2 processes"] and list(table.index) == [1, 2, 3, 4]
    assert list(parity.table(ends=1).index) == [1, 4]
    assert list(parity.table(ends=2).index) == [1, 2, 3, 4]   # no row twice


def test_refusals():
    fn = FakeLaunch({1: [1.0], 2: [1.0]})
    with pytest.raises(ValueError, match="batch_size=63 does not split evenly over the 2 processes"):
        compare_processes(fn, plan=None, batch_size=63)
    assert fn.launches == [], "nothing may be launched on a batch that does not split"
    with pytest.raises(ValueError, match="returned no losses"):
        _ = Parity([], [], 2, "cpu").max_diff
