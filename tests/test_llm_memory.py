"""Notebook 07 under FSDP + LoRA with model_name: no process but the loading rank holds the model.

benchmarks/llm_memory.py at about 200 MB (bf16; 400 MB at the ranks' fp32) and 2 ranks: notebook 07 runs once
on a tiny GPT-OSS checkpoint and once on the 200 MB one, every process's peak RSS polled from outside; rank 1
may grow by at most its shard + the layer-sized tensors FSDP2 and PEFT hold at once + the LoRA adapters + the
benchmark's slack, the kernel by at most its slack.
The benchmark's own functions do the runs and the judging (nothing is copied here).
"""

from __future__ import annotations

import pytest

from benchmarks.llm_memory import SLACK_WHY, loading_rank_lines, measure, peak_cell_lines, table, verdicts

pytestmark = pytest.mark.notebook


def test_only_the_loading_rank_holds_the_model(tmp_path):
    lines: list[str] = []
    figures = measure(200, [2], tmp_path, n_train=4, n_test=2, log=lines.append)
    shown = "\n".join([*lines, table(figures), *loading_rank_lines(figures), *peak_cell_lines(figures),
                       *SLACK_WHY.values()])
    failed = verdicts(figures)
    assert not failed, "\n".join(failed) + "\n" + shown


def test_peaks_go_to_ranks_by_pid_order_and_a_stray_process_is_refused():
    """TreePeaks assigns the forkserver's children to ranks launch by launch; a count that is not whole
    launches raises RankCountError (run_07 then measures again) instead of assigning peaks by guess."""
    from benchmarks.llm_memory import MB, RankCountError, TreePeaks

    peaks = TreePeaks()
    peaks.kernels = {100}
    peaks.cell_peaks = {100: {0: 5 * MB, 3: 9 * MB}}
    peaks.ranks = {201: 1.0, 202: 1.1, 301: 9.0, 302: 9.1}        # two launches of 2 ranks
    peaks.peaks = {201: 10 * MB, 202: 30 * MB, 301: 20 * MB, 302: 25 * MB}
    roles = peaks.by_role(2, kernel_until=3)
    assert {k: v[0] // MB for k, v in roles.items()} == {"kernel": 5, "rank 0": 20, "rank 1": 30}
    peaks.first_cell = {201: 5, 202: 5, 301: 9, 302: 9}
    peaks.ranks[150], peaks.first_cell[150] = 0.5, 2   # a forkserver child alone in an earlier cell
    ranks = {k: v[0] // MB for k, v in peaks.by_role(2).items() if k != "kernel"}
    assert ranks == {"rank 0": 20, "rank 1": 30}
    assert 150 not in peaks.ranks
    peaks.ranks[303], peaks.first_cell[303] = 9.5, 9   # one process more, in a launch's own cell
    with pytest.raises(RankCountError, match=r"saw 5 rank processes, not a multiple of 2.*\(303, 8\.5, 0\)"):
        peaks.by_role(2)
