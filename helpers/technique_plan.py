"""Bytes of model state a GPU holds under each technique (DDP, FSDP, ZeRO-1/2/3, ZeRO with CPU offload), the
simplest technique that fits, and the tables of both, from a model's `ParamCounts` (`helpers.param_counts`).

Why: which technique a model needs follows from a few bytes a parameter and how each technique splits them
over the GPUs; the bytes a parameter and the layouts are in `helpers.memory_plan`'s docstring, the page a
reader of the lessons opens.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from helpers.param_counts import MODES, ParamCounts, count_real_model
from helpers.published_models import REAL_MODELS, real_model

GB = 1e9
TECHNIQUES = {"ddp": "DDP", "fsdp": "FSDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
              "zero2_offload": "ZeRO-2 + offload", "zero3_offload": "ZeRO-3 + offload"}
# fp32 optimizer state a trained parameter, beside any master copy: Adam's two moments, SGD's momentum
OPTIMIZER_STATE_BYTES = {"adamw": 8, "sgd": 4}
# The share of each GPU left for activations and buffers when deciding what fits
DEFAULT_HEADROOM = 0.25
# which_technique tries these in order: the simplest that fits wins
_ADVICE_ORDER = ("ddp", "fsdp", "zero3_offload")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a GPU holds for model state under one technique, by role; `cpu` is each rank's CPU share."""

    technique: str
    world_size: int
    parameters: float
    gradients: float
    optimizer: float
    gathered: float = 0.0
    cpu: float = 0.0

    @property
    def total(self) -> float:
        """GPU bytes in all: parameters, gradients, optimizer state and the gathered unit."""
        return self.parameters + self.gradients + self.optimizer + self.gathered

    @property
    def sharded_state(self) -> float:
        """GPU bytes without the gathered unit: what the technique keeps between steps."""
        return self.parameters + self.gradients + self.optimizer

    def as_gb(self) -> dict[str, float]:
        """The breakdown in GB (1e9 bytes), for a table."""
        return {"parameters": self.parameters / GB, "gradients": self.gradients / GB,
                "optimizer state": self.optimizer / GB, "gathered unit": self.gathered / GB,
                "total (GPU)": self.total / GB, "CPU per rank": self.cpu / GB}


@dataclass(frozen=True)
class Advice:
    """which_technique's answer: the technique (None when nothing fits), its estimate and why."""

    technique: str | None
    estimate: MemoryEstimate | None
    reason: str



def _check_world_size(world_size: int) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r}: give the number of GPUs (processes), a whole number "
                         "of 1 or more.")



def model_state_bytes(counts: ParamCounts, technique: str, world_size: int,
                      optimizer: str = "adamw") -> MemoryEstimate:
    """Bytes of model state one GPU holds when `counts`' model trains with `technique` on `world_size` GPUs.

    The layouts are in `helpers.memory_plan`'s docstring; `optimizer` is "adamw" (two fp32 moments) or "sgd"
    (momentum).
    """
    if technique not in TECHNIQUES:
        raise ValueError(f"technique={technique!r}: use one of {', '.join(map(repr, TECHNIQUES))}.")
    _check_world_size(world_size)
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer={optimizer!r}: use one of "
                         f"{', '.join(map(repr, OPTIMIZER_STATE_BYTES))}.")
    n, t, w = world_size, counts.trainable, counts.frozen_bytes
    moments = OPTIMIZER_STATE_BYTES[optimizer]
    if technique == "ddp":            # fp32 trainable parameters, gradients, moments: all on every GPU
        return MemoryEstimate(technique, n, w + 4 * t, 4 * t, moments * t)
    if technique == "fsdp":           # the same, sharded; the unit being computed gathered in bf16
        return MemoryEstimate(technique, n, (w + 4 * t) / n, 4 * t / n, moments * t / n,
                              gathered=counts.gathered_bytes)
    # DeepSpeed: 16-bit parameters and gradients; optimizer state = fp32 master copy + moments
    state = (4 + moments) * t
    if technique == "zero1":
        return MemoryEstimate(technique, n, w + 2 * t, 2 * t, state / n)
    if technique == "zero2":
        return MemoryEstimate(technique, n, w + 2 * t, 2 * t / n, state / n)
    if technique == "zero3":
        return MemoryEstimate(technique, n, (w + 2 * t) / n, 2 * t / n, state / n,
                              gathered=counts.gathered_bytes)
    cpu = (4 * t + state) / n   # offload: the fp32 gradient partition, master copy and moments in CPU memory
    if technique == "zero2_offload":
        return MemoryEstimate(technique, n, w + 2 * t, 0.0, 0.0, cpu=cpu)
    return MemoryEstimate(technique, n, (w + 2 * t) / n, 0.0, 0.0, gathered=counts.gathered_bytes, cpu=cpu)


def fsdp_with_layers_in_flight(counts: ParamCounts, estimate: MemoryEstimate, layers: float) -> float:
    """GPU bytes of FSDP's model state when `layers` layers' worth are gathered at once, beside the sharded
    state and the root's embeddings and head: what a measured count of layers in flight
    (benchmarks/llm_memory.py, under expert LoRA) makes of the plan's one gathered layer."""
    if estimate.technique != "fsdp":
        raise ValueError(f"layers in flight are FSDP's; this estimate is {estimate.technique!r}")
    return estimate.sharded_state + counts.outside_bytes + layers * counts.block_bytes


def which_technique(counts: ParamCounts, world_size: int, gpu_gb: float, headroom: float = DEFAULT_HEADROOM,
                    optimizer: str = "adamw", cpu_gb: float | None = None) -> Advice:
    """The simplest technique whose model state fits each GPU, keeping `headroom` of it for activations.

    The rule: DDP when the whole model state fits one GPU (no gathers: the fastest and simplest); FSDP
    (or ZeRO-3, the same split) when it does not but its shard does; ZeRO-3 with the optimizer state
    offloaded to CPU memory for the largest; otherwise nothing on this many GPUs (the reason says how
    many FSDP needs). ZeRO-1 and -2 lie between DDP and FSDP; the table shows them. With `cpu_gb` (the CPU
    memory of the machine the `world_size` GPUs share), offload counts only where its CPU share fits there.
    """
    _check_world_size(world_size)
    if not gpu_gb > 0:
        raise ValueError(f"gpu_gb={gpu_gb!r}: give each GPU's memory in GB (80 for an H100), more than 0.")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom={headroom!r}: the share of each GPU kept for activations lies in [0, 1), "
                         f"e.g. {DEFAULT_HEADROOM}.")
    budget = gpu_gb * GB * (1 - headroom)
    where = f"{budget / GB:.1f} GB of each {gpu_gb:g} GB GPU ({headroom:.0%} kept for activations)"
    estimates = {t: model_state_bytes(counts, t, world_size, optimizer) for t in _ADVICE_ORDER}
    ddp, fsdp, offload = estimates.values()
    if ddp.total <= budget:
        return Advice("ddp", ddp, f"DDP: the whole model state, {ddp.total / GB:.1f} GB, fits in {where}; "
                                  "every GPU keeps a copy and nothing is gathered.")
    if fsdp.total <= budget:
        return Advice("fsdp", fsdp, f"FSDP: DDP would need {ddp.total / GB:.1f} GB a GPU; sharded over "
                                    f"{world_size} GPUs it needs {fsdp.total / GB:.1f} GB, within {where}.")
    cpu_fits = cpu_gb is None or offload.cpu * world_size <= cpu_gb * GB
    if offload.total <= budget and cpu_fits:
        return Advice("zero3_offload", offload,
                      f"ZeRO-3 + offload: FSDP would need {fsdp.total / GB:.1f} GB a GPU; with the optimizer "
                      f"state in CPU memory ({offload.cpu * world_size / GB:.0f} GB in all) the GPUs keep "
                      f"{offload.total / GB:.1f} GB each, within {where}.")
    needed = next((g for g in (2 ** k for k in range(1, 15))
                   if model_state_bytes(counts, "fsdp", g, optimizer).total <= budget), None)
    more = f"FSDP fits on {needed} such GPUs" if needed else "no number of such GPUs holds one gathered unit"
    offloaded = (f"ZeRO-3 + offload needs {offload.total / GB:.1f} GB a GPU" if offload.total > budget else
                 f"ZeRO-3 + offload needs {offload.cpu * world_size / GB:.0f} GB of CPU memory, over "
                 f"{cpu_gb:g}")
    return Advice(None, None, f"nothing fits {world_size} GPUs: FSDP needs {fsdp.total / GB:.1f} GB a GPU, "
                              f"over {where}, and {offloaded}. {more}; or train LoRA / QLoRA.")


def technique_table(models: Iterable[str | ParamCounts] = tuple(REAL_MODELS), world_size: int = 8,
                    gpu_gb: float = 80.0, modes: Sequence[str] = tuple(MODES),
                    techniques: Sequence[str] = tuple(TECHNIQUES), optimizer: str = "adamw",
                    headroom: float = DEFAULT_HEADROOM, cpu_gb: float | None = None) -> list[dict[str, Any]]:
    """One row per model and way of training: sizes, GB per GPU under each technique, the advice.

    `models` holds names of REAL_MODELS (a row for each of `modes`) or ParamCounts (one row each, for a
    notebook's own model). `pandas.DataFrame(rows)` displays them.
    """
    _check_world_size(world_size)
    unknown = [t for t in techniques if t not in TECHNIQUES]
    if unknown:
        raise ValueError(f"techniques {unknown}: use names from {', '.join(map(repr, TECHNIQUES))}.")
    rows = []
    for model in models:
        if isinstance(model, str):
            real_model(model)
            all_counts = [count_real_model(model, mode) for mode in modes]
        else:
            all_counts = [model]
        for counts in all_counts:
            row: dict[str, Any] = {"model": counts.name, "trained": MODES[counts.mode],
                                   "parameters (B)": counts.total / 1e9,
                                   "trainable (M)": counts.trainable / 1e6}
            for technique in techniques:
                estimate = model_state_bytes(counts, technique, world_size, optimizer)
                row[TECHNIQUES[technique]] = estimate.total / GB
            if "zero3_offload" in techniques:
                row["offload CPU, all ranks"] = (model_state_bytes(counts, "zero3_offload", world_size,
                                                                   optimizer).cpu * world_size / GB)
            advice = which_technique(counts, world_size, gpu_gb, headroom, optimizer, cpu_gb)
            row["advice"] = TECHNIQUES.get(advice.technique, "does not fit")
            rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]], gpu_gb: float, headroom: float = DEFAULT_HEADROOM) -> str:
    """The rows as a markdown table; GPU figures over the budget are marked."""
    budget = gpu_gb * (1 - headroom)
    gpu_columns = set(TECHNIQUES.values())

    def cell(column: str, value: Any) -> str:
        if isinstance(value, float):
            text = f"{value:.2f}" if column.endswith("(B)") else f"{value:,.1f}"
            return text + (" ✗" if column in gpu_columns and value > budget else "")
        return str(value)

    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(c, row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
