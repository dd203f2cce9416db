"""Notebook 07 under FSDP + LoRA with model_name: no process but the loading rank holds the model.

benchmarks/llm_memory.py at about 200 MB (bf16; 400 MB at the ranks' fp32) and 2 ranks, with gradient
checkpointing on and off: notebook 07 runs on a tiny GPT-OSS checkpoint and on the 200 MB one, every process's
peak RSS polled from outside; rank 1 may grow by at most its shard + the layer-sized tensors FSDP2 and PEFT
hold at once + the LoRA adapters + the benchmark's slack (checkpointing off: + every other layer's merged
expert weights), the kernel by at most its slack. The benchmark's own functions do the runs and the judging
(nothing is copied here). The stored run's readers take their figures from the checkpointing-on rows only.
"""

from __future__ import annotations

import pytest

from benchmarks.llm_memory import (
    MB,
    SLACK_WHY,
    loading_rank_lines,
    measure,
    peak_cell_lines,
    recommended,
    rows,
    table,
    verdicts,
)

pytestmark = pytest.mark.notebook


def test_only_the_loading_rank_holds_the_model(tmp_path):
    lines: list[str] = []
    figures = measure(200, [2], tmp_path, n_train=4, n_test=2, off_ranks=[2], deep=False, log=lines.append)
    assert {(r["gradient_checkpointing"], r["ranks"]) for r in rows(figures)} == {(True, 2), (False, 2)}
    shown = "\n".join([*lines, table(figures), *loading_rank_lines(figures), *peak_cell_lines(figures),
                       *SLACK_WHY.values()])
    failed = verdicts(figures)
    assert not failed, "\n".join(failed) + "\n" + shown


def test_a_process_is_the_rank_its_output_log_names(tmp_path):
    """stdout_rank reads a process's rank from its standard output, torch elastic's log of that rank, from
    outside; a process writing elsewhere is no rank."""
    import subprocess
    import sys

    from benchmarks.llm_memory import stdout_rank

    log = tmp_path / "attempt_0" / "1" / "stdout.log"
    log.parent.mkdir(parents=True)
    with open(log, "w") as out:
        rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=out)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             stdout=subprocess.DEVNULL)
    try:
        assert (stdout_rank(rank.pid), stdout_rank(other.pid)) == (1, None)
    finally:
        rank.kill()
        other.kill()
        rank.wait()
        other.wait()


def test_peaks_go_to_the_rank_each_process_names_and_a_missing_rank_is_refused():
    """TreePeaks assigns each forkserver child to the rank its output names, a rank's peak the highest over
    the launches; a child that names none is listed, not measured; a launch with a rank missing raises
    RankCountError (run_07 then measures again) instead of assigning peaks by guess."""
    from benchmarks.llm_memory import RankCountError, TreePeaks

    peaks = TreePeaks()
    peaks.kernels = {100}
    peaks.cell_peaks = {100: {0: 5 * MB, 3: 9 * MB}}
    # two launches of 2 ranks, the second's rank 1 started before its rank 0; 150 is no rank
    peaks.children = {201: 0, 202: 1, 302: 0, 301: 1, 150: None}
    peaks.described = {150: "python -c ... > /dev/null"}
    peaks.peaks = {201: 10 * MB, 202: 30 * MB, 301: 20 * MB, 302: 25 * MB, 150: 99 * MB}
    roles = peaks.by_role(2, kernel_until=3)
    assert {k: v[0] // MB for k, v in roles.items()} == {"kernel": 5, "rank 0": 25, "rank 1": 30}
    assert peaks.others() == {150: "python -c ... > /dev/null"}
    del peaks.children[301]   # the second launch's rank 1 never seen
    with pytest.raises(RankCountError, match=r"\{0: 2, 1: 1\}, not whole launches of 2 ranks.*150"):
        peaks.by_role(2)


def _figures(growth_off_mb: float) -> dict:
    """One shape (4 layers of 10 MB, 8 MB of expert weights each; 40 MB model), 2 ranks, rank 1 grown by
    25 MB with checkpointing on and `growth_off_mb` with it off."""
    model = {"model_bytes": 40 * MB, "layer_bytes": 10 * MB, "layers": 4, "expert_bytes": 8 * MB,
             "adapter_parameters": 0}
    tiny = {"peaks": {"kernel": 100 * MB, "rank 0": 100 * MB, "rank 1": 100 * MB}}

    def run(on: bool, grown: float) -> dict:
        return {"shape": "s", "gradient_checkpointing": on, "ranks": 2, "tiny": tiny,
                "big": {"peaks": {"kernel": 100 * MB, "rank 0": 160 * MB, "rank 1": (100 + grown) * MB}}}

    return {"shapes": {"s": {"model": model}}, "runs": [run(True, 25), run(False, growth_off_mb)]}


def test_without_checkpointing_a_rank_is_bounded_by_every_layers_merged_experts():
    """The limit with checkpointing off is the checkpointing-on one + (layers - 1) x a layer's expert weights:
    a rank holding them passes, one holding more fails, and readers see only the checkpointing-on rows."""
    from benchmarks.llm_memory import EXPERT_LORA_COPIES, RANK_SLACK_MB

    on_limit = 20 + 10 + EXPERT_LORA_COPIES * 8 + RANK_SLACK_MB
    off_limit = on_limit + 3 * 8
    judged = {r["gradient_checkpointing"]: r for r in rows(_figures(off_limit - 1))
              if r["process"] == "rank 1"}
    assert (judged[True]["limit_mb"], judged[False]["limit_mb"]) == (on_limit, off_limit)
    assert judged[True]["ok"] and judged[False]["ok"] and not verdicts(_figures(off_limit - 1))
    failed = verdicts(_figures(off_limit + 1))
    assert len(failed) == 1 and "checkpointing off" in failed[0]
    assert "every other layer's merged experts" in failed[0]
    assert all(r["gradient_checkpointing"] for r in recommended(rows(_figures(off_limit + 1))))


def test_the_stored_run_has_both_settings_and_its_readers_use_checkpointing_on():
    """docs/llm-memory.json holds both settings at both shapes; helpers.gallery.scale_up_table's figures come
    from the checkpointing-on rows, which the off rows would change."""
    import json

    from helpers.gallery.scale_up_table import measured_memory
    from helpers.paths import ROOT

    stored = ROOT / "docs" / "llm-memory.json"
    all_rows = json.loads(stored.read_text())["rows"]
    assert {(r["shape"], r["gradient_checkpointing"]) for r in all_rows} == {
        (s, on) for s in ("36 layers, bf16 file", "24 layers, fp32 file") for on in (True, False)}
    on = [r for r in recommended(all_rows) if r["in_flight_layers"] is not None]
    off = [r for r in all_rows if not r["gradient_checkpointing"] and r["in_flight_layers"] is not None]
    assert measured_memory(stored)["in_flight"] == max(r["in_flight_layers"] for r in on)
    assert max(r["in_flight_layers"] for r in off) > max(r["in_flight_layers"] for r in on)
