"""What each scale-up command needs and what has been run of it: the table of docs/scaling-up.md.

Written from the sources that hold each fact, never typed: the command from `helpers.gallery.scale_up`, the
machine from its `where`, the planned model state per GPU and the model's size from `helpers.memory_plan` (for
the commands that name a published model) with, under FSDP, the layers in flight and rank 0's loading memory
that benchmarks/llm_memory.py measured (docs/llm-memory.json), the GPU check's newest result per notebook from
the reports kept in docs/gpu-check/. What nothing has measured (a full run's time on GPUs) is said to be
unmeasured.

    python -m helpers.gallery.scale_up_table           # print the page's generated part
    python -m helpers.gallery.scale_up_table --write   # write it into docs/scaling-up.md
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from helpers.gallery.catalog import CATALOG
from helpers.gallery.scale_up import SCALE_UPS, command

MARKERS = ("<!-- scale-up-table -->", "<!-- /scale-up-table -->")
# The published model each LLM command names, how it trains, and under which technique (helpers.memory_plan's
# names), from the catalog; the other commands train the gallery's own models, a few MB to a few hundred MB.
PLANNED = {nb.stem: (nb.planned.model, nb.planned.training, nb.planned.technique)
           for nb in CATALOG if nb.planned}


def gpus_of(where: str) -> int | None:
    """The GPU count a command is meant for, from its `where` ("on 8 GPUs, ...")."""
    found = re.search(r"(\d+) GPUs", where)
    return int(found[1]) if found else None


def gpu_check_results(folder: Path) -> dict[str, dict]:
    """Each notebook's newest GPU-check result, with the GPU it ran on."""
    newest: dict[str, dict] = {}
    for path in sorted(folder.glob("*.json")):
        report = json.loads(path.read_text())
        gpu = (report.get("gpu") or {}).get("name", "a GPU")
        for result in report.get("results", []):
            newest[result["notebook"]] = dict(result, gpu=gpu)
    return newest


def measured_memory(path: Path) -> dict[str, float] | None:
    """From the memory benchmark's stored run (benchmarks/llm_memory.py --json): the most layers' worth any
    rank but rank 0 held beyond its shard and adapters, and the most models' worth rank 0 held loading, in
    the configuration the LLM commands run (gradient checkpointing on; its rows with it off show what the
    notebook's default would hold, every layer's merged expert weights, and size nothing here)."""
    if not path.exists():
        return None
    rows = [r for r in json.loads(path.read_text())["rows"] if r["gradient_checkpointing"]]
    loading = [r for r in rows if r["process"] == "rank 0"]
    return {"in_flight": max(r["in_flight_layers"] for r in rows if r.get("in_flight_layers") is not None),
            "loader": max((r["model_memory_mb"] - r["shard_mb"]) / r["model_mb"] for r in loading)}


def planned_cells(notebook: str, gpus: int | None, measured: dict[str, float] | None) -> tuple[str, str, str]:
    """(model state per GPU, host memory, the model in bf16), for a command that names a published model."""
    if notebook not in PLANNED or gpus is None:
        return "the gallery's own model (under 1 GB)", "-", "-"
    from helpers import memory_plan

    name, mode, technique = PLANNED[notebook]
    counts = memory_plan.count_real_model(name, mode)
    estimate = memory_plan.model_state_bytes(counts, technique, gpus)
    label = f"{memory_plan.MODES[mode]}, {memory_plan.TECHNIQUES[technique]}"
    bf16 = memory_plan.count_real_model(name).total * memory_plan.BF16_BYTES / memory_plan.GB   # no adapters
    state = f"{estimate.total / memory_plan.GB:.1f} ({name}, {label}; planned, one layer gathered)"
    host = "-"
    if technique == "fsdp" and measured:
        flight = memory_plan.fsdp_with_layers_in_flight(counts, estimate, measured["in_flight"])
        state += (f"; {flight / memory_plan.GB:.1f} with the {measured['in_flight']:.1f} layers in flight "
                  "the memory benchmark measured")
        host = f"rank 0 about {measured['loader'] * bf16:.0f} while it loads (measured share of the model)"
    return state, host, f"{bf16:.1f}"


def table(gpu_check_dir: Path, memory_json: Path) -> str:
    checked = gpu_check_results(gpu_check_dir)
    measured = measured_memory(memory_json)
    rows = ["| notebook | machine | model state per GPU (GB) | host memory (GB) | model in bf16 (GB) "
            "| what has run |", "|---|---|---|---|---:|---|"]
    for notebook, scale in SCALE_UPS.items():
        gpus = gpus_of(scale.where)
        state, host, size = planned_cells(notebook, gpus, measured)
        ran = ["this command, step-capped, on CPU stand-ins of the data (tests/test_scale_up.py)"]
        result = checked.get(notebook)
        if result and result["status"] == "passed":
            ran.append(f"the notebook's GPU path at its small size on one {result['gpu']} (the GPU check)")
        rows.append(f"| {notebook[:2]} | {scale.where[3:] if scale.where.startswith('on ') else scale.where} "
                    f"| {state} | {host} | {size} | {'; '.join(ran)} |")
    commands = "\n\n".join(f"**{nb}** ({s.where}):\n\n```bash\n{command(nb)}\n```"
                           for nb, s in SCALE_UPS.items())
    return ("\n".join(rows) + "\n\nNo full run of these commands has been timed on GPUs: the time to expect "
            "is not measured.\n\n" + commands)


def write(page: Path, gpu_check_dir: Path, memory_json: Path) -> None:
    start, end = MARKERS
    text = page.read_text()
    if text.count(start) != 1 or text.count(end) != 1:
        raise SystemExit(f"{page}: expected one {start} and one {end}; put them back first.")
    head, rest = text.split(start)
    page.write_text(f"{head}{start}\n{table(gpu_check_dir, memory_json)}\n{end}{rest.split(end, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    from helpers.paths import ROOT

    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--write"]:
        write(ROOT / "docs" / "scaling-up.md", ROOT / "docs" / "gpu-check", ROOT / "docs" / "llm-memory.json")
        print("wrote the table into docs/scaling-up.md")
    elif not argv:
        print(table(ROOT / "docs" / "gpu-check", ROOT / "docs" / "llm-memory.json"))
    else:
        raise SystemExit("usage: python -m helpers.gallery.scale_up_table [--write]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
