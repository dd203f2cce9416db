"""How fast a training run goes: tokens per second, model FLOPs utilisation (MFU), and the device's peak.

Kept out of the lessons' loops because it is measurement, not the technique: a loop calls `timer.start()` and
`timer.stop()` around each training step (checkpoints and evaluations stay outside, so they do not count),
and the notebook turns what the ranks measured into MFU with `model_flops_utilisation`:

    timer = StepTimer()
    for step in ...:
        timer.start()
        ...                                    # the training step
        timer.stop()
    return {"tokens_per_s": timer.tokens_per_s(batch_size * context), **device_peak(device, dtype)}

MFU is the achieved FLOP/s over the device's peak: the vendor's datasheet figure for the compute dtype where
the GPU is in `DATASHEET_TFLOPS`, else the best of a few large matmuls the rank timed on its own device
(`matmul_peak_flops`), and `model_flops_utilisation` says which it used.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Dense bf16/fp16 tensor-core peaks (TFLOP/s, no sparsity) from the vendors' datasheets; the first name found
# in the device's name wins, so the more specific names come first. fp32 without TF32 is far lower: an fp32
# run is measured instead.
DATASHEET_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H100": 756.0, "A100": 312.0,
                    "L40S": 362.0, "L4": 121.0, "A10": 125.0}
WARMUP_STEPS = 3   # the first steps allocate, tune kernels and fill caches: not the steady speed


@dataclass
class StepTimer:
    """Wall-clock seconds of each training step; `synchronize` waits for the GPU before reading the clock."""

    synchronize: bool = False
    seconds: list[float] = field(default_factory=list)
    _started: float | None = None

    def start(self) -> None:
        self._sync()
        self._started = time.perf_counter()

    def stop(self) -> float:
        """End the step started last; its seconds."""
        if self._started is None:
            raise RuntimeError("StepTimer.stop() without start()")
        self._sync()
        self.seconds.append(time.perf_counter() - self._started)
        self._started = None
        return self.seconds[-1]

    def _sync(self) -> None:
        if self.synchronize:
            import torch

            torch.cuda.synchronize()

    def steady(self, warmup: int = WARMUP_STEPS) -> list[float]:
        """The steps after the first `warmup` (all of them when the run was shorter)."""
        return self.seconds[warmup:] or self.seconds

    def tokens_per_s(self, tokens_per_step: int, warmup: int = WARMUP_STEPS) -> float:
        """Mean tokens per second over the steady steps (nan when no step was timed)."""
        steady = self.steady(warmup)
        return tokens_per_step * len(steady) / sum(steady) if steady and sum(steady) > 0 else float("nan")


def matmul_peak_flops(device: Any, dtype: Any = None, size: int | None = None, repeats: int = 10) -> float:
    """The device's achievable FLOP/s: the best of `repeats` square matmuls in `dtype` (fp32 when None).

    The first matmul is a warm-up and not counted. Sizes: 8192 on a GPU (big enough to reach the tensor
    cores' peak), 1024 on a CPU (a few milliseconds each).
    """
    import torch

    device = torch.device(device)
    dtype = dtype or torch.float32
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    timings = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timings.append(time.perf_counter() - start)
    return 2 * size ** 3 / min(timings[1:] or timings)


def device_peak(device: Any, dtype: Any = None) -> dict[str, Any]:
    """In a rank: the device's name and its measured matmul peak, for `model_flops_utilisation`."""
    import torch

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device_name": name, "peak_flops": matmul_peak_flops(device, dtype)}


def flops_per_token(hidden_size: int, layers: int, context: int, vocab_size: int) -> int:
    """Training FLOPs per token of a GPT: 6 x the weights used in matmuls (forward and backward), plus
    12 x layers x context x width for attention (the usual estimate, PaLM's appendix B)."""
    matmul_weights = layers * 12 * hidden_size ** 2 + hidden_size * vocab_size
    return 6 * matmul_weights + 12 * layers * context * hidden_size


def datasheet_flops(device_name: str, precision: str) -> float | None:
    """The datasheet peak (FLOP/s) for a bf16/fp16 run on a GPU in the table; None otherwise."""
    if precision not in ("bf16", "fp16"):
        return None
    tflops = next((v for k, v in DATASHEET_TFLOPS.items() if k in device_name), None)
    return None if tflops is None else tflops * 1e12


@dataclass(frozen=True)
class Utilisation:
    mfu: float                # achieved FLOP/s over the peak of all ranks together
    peak_per_rank: float      # FLOP/s
    peak_source: str          # where the peak comes from, in words
    flops_per_token: int
    tokens_per_s: float

    def summary(self, processes: int, precision: str, peak_gpu_mb: float | None = None) -> str:
        """What the lesson prints: tokens/s, FLOPs per token, the peak and where it comes from, MFU; and the
        GPU allocator's peak per rank where the ranks had GPUs."""
        text = (f"{self.tokens_per_s:,.0f} tokens/s over {processes} process(es) ({precision}, "
                f"{self.flops_per_token / 1e6:.2f} MFLOP per token)\npeak per rank: "
                f"{self.peak_per_rank / 1e9:,.1f} GFLOP/s ({self.peak_source}); MFU {100 * self.mfu:.1f}%")
        if peak_gpu_mb is not None:
            text += f"\nGPU allocator peak per rank: {peak_gpu_mb:.0f} MiB"
        return text


def model_flops_utilisation(config: Any, ranks: Sequence[Mapping[str, Any]]) -> Utilisation:
    """MFU of a run from what its ranks returned (`tokens_per_s`, `device_name`, `peak_flops`, `precision`)
    and the model's configuration (a GPTConfig: hidden_size, layers, context, vocab_size)."""
    main = ranks[0]
    per_token = flops_per_token(config.hidden_size, config.layers, config.context, config.vocab_size)
    peak = datasheet_flops(main["device_name"], main["precision"])
    if peak is not None:
        source = f"{main['device_name']} datasheet, dense {main['precision']}"
    else:
        peak = sum(r["peak_flops"] for r in ranks) / len(ranks)
        source = f"measured {main['precision']} matmul on {main['device_name']} (no datasheet figure)"
    mfu = per_token * main["tokens_per_s"] / (len(ranks) * peak)
    return Utilisation(mfu, peak, source, per_token, main["tokens_per_s"])


def quiet_compile() -> None:
    """In a rank that compiles: silence two notes that are about the machine, not the lesson (inductor's note
    that a CPU-only host has no CUDA toolkit for C++ extensions, and dynamo's that DDP's profiler labels are
    skipped inside a compiled graph). Errors still show."""
    import logging

    import torch

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    torch._logging.set_logs(dynamo=logging.ERROR)


def inductor_cache_counts() -> dict[str, int]:
    """How many compiled graphs inductor's on-disk cache held ("hit") and how many it generated ("miss"),
    in this process so far: a warm cache is why a second compile is faster than the first."""
    from torch._dynamo.utils import counters

    return {k: counters["inductor"][f"fxgraph_cache_{k}"] for k in ("hit", "miss")}


def cache_state(counts: dict[str, int]) -> str:
    """"warm" (every graph found in the cache), "cold" (every graph generated), "partly warm", or "off"."""
    found, generated = counts["hit"], counts["miss"]
    if found and not generated:
        return "warm"
    if generated and not found:
        return "cold"
    return "partly warm" if found else "off"
