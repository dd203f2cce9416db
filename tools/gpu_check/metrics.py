"""What a notebook's recorded metrics must say for the run to count: it really trained on the device (cuda,
nccl, bf16 where the GPU has it; cpu, gloo, fp32 with `--device cpu`), allocated memory there and reported a
throughput."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Lightning's precision names (notebook 03 records those) and the notebooks' own
PRECISION_NAMES = {"bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16", "16-mixed": "fp16",
                   "16-true": "fp16", "fp16": "fp16", "16": "fp16", "32-true": "fp32", "32": "fp32",
                   "fp32": "fp32"}


@dataclass(frozen=True)
class Expect:
    device: str
    backend: str
    precision: str


def expectations(device: str, bf16_supported: bool | None = None) -> Expect:
    """What the metrics must say: on a GPU, cuda/nccl and bf16 where the GPU has it (else fp16)."""
    if device == "cpu":
        return Expect("cpu", "gloo", "fp32")
    if bf16_supported is None:
        import torch

        bf16_supported = torch.cuda.is_bf16_supported()
    return Expect("cuda", "nccl", "bf16" if bf16_supported else "fp16")


def _positive_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and value > 0


def check_metrics(metrics: dict[str, Any], expect: Expect, throughput: str,
                  processes: int | None = None) -> list[str]:
    """What is wrong with a notebook's recorded metrics for this device: [] when it really ran there."""
    if not metrics:
        return ["recorded no metrics (record_metrics did not run)"]
    problems = []
    for key in ("device", "backend"):
        if metrics.get(key) != getattr(expect, key):
            problems.append(f"{key} is {metrics.get(key)!r}, expected {getattr(expect, key)!r}")
    seen = metrics.get("precision")
    if PRECISION_NAMES.get(str(seen)) != expect.precision:
        problems.append(f"precision is {seen!r}, expected {expect.precision!r}")
    if not _positive_number(metrics.get(throughput)):
        problems.append(f"throughput {throughput} is {metrics.get(throughput)!r}, expected a number > 0")
    peak = metrics.get("peak_gpu_mb")
    if expect.device == "cuda" and not _positive_number(peak):
        problems.append(f"peak_gpu_mb is {peak!r}: nothing was allocated on the GPU")
    if expect.device == "cpu" and peak not in (None, 0, "None"):
        problems.append(f"peak_gpu_mb is {peak!r} on a CPU run")
    if processes is not None and metrics.get("processes") != processes:
        problems.append(f"processes is {metrics.get('processes')!r}, expected {processes}")
    return problems
