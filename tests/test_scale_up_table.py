"""docs/scaling-up.md's table is what helpers.gallery.scale_up_table writes from its sources (the commands,
the memory plan, the memory benchmark's stored run, the GPU check's reports): the two cannot differ."""

from __future__ import annotations

import dataclasses

from helpers.gallery import scale_up, scale_up_table
from helpers.paths import ROOT

DOCS = ROOT / "docs"


def _generated(text: str) -> str:
    start, end = scale_up_table.MARKERS
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def test_the_page_is_what_its_sources_say():
    page = (DOCS / "scaling-up.md").read_text()
    expected = scale_up_table.table(DOCS / "gpu-check", DOCS / "llm-memory.json")
    assert _generated(page) == expected.strip(), (
        "docs/scaling-up.md differs from its sources: python -m helpers.gallery.scale_up_table --write")


def test_a_changed_command_or_figure_shows(monkeypatch, tmp_path):
    before = scale_up_table.table(DOCS / "gpu-check", DOCS / "llm-memory.json")
    entry = scale_up.SCALE_UPS["01_ddp_mlp"]
    monkeypatch.setitem(scale_up.SCALE_UPS, "01_ddp_mlp",
                        dataclasses.replace(entry, parameters={**entry.parameters, "lr": 0.8}))
    assert scale_up_table.table(DOCS / "gpu-check", DOCS / "llm-memory.json") != before
    monkeypatch.undo()
    # without the memory benchmark's run, 07's row says only what is planned
    plain = scale_up_table.table(DOCS / "gpu-check", tmp_path / "none.json")
    row = next(line for line in plain.splitlines() if line.startswith("| 07 "))
    assert "planned" in row and "layers in flight" not in row
    measured = scale_up_table.measured_memory(DOCS / "llm-memory.json")   # its checkpointing-on rows
    assert f"the {measured['in_flight']:.1f} layers in flight" in next(
        line for line in before.splitlines() if line.startswith("| 07 "))


def test_the_fsdp_figure_adds_the_measured_layers():
    from helpers import memory_plan

    counts = memory_plan.count_real_model("gpt-oss-120b", "lora")
    plan = memory_plan.model_state_bytes(counts, "fsdp", 8)
    assert memory_plan.fsdp_with_layers_in_flight(counts, plan, 1) == plan.total   # the plan: one layer
    assert memory_plan.fsdp_with_layers_in_flight(counts, plan, 3) == plan.total + 2 * counts.block_bytes
