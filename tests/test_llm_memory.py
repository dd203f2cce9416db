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
