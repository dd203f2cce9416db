"""What machine this is, said one way for the run reports, the reference files and the benchmark pages."""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

from helpers.cpus import usable_cpus


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (platform's guess elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                return set(value.split())
    except OSError:
        pass
    return set()


def instruction_sets(flags: set[str] | None = None) -> str:
    """Which of the instruction sets torch's CPU kernels use this CPU has: AVX2, AVX-512, AMX."""
    flags = cpu_flags() if flags is None else flags
    found = [label for flag, label in (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("amx_tile", "AMX"))
             if flag in flags]
    if not found:
        return "no AVX2" if flags else f"{platform.machine()} (no cpuinfo flags)"
    return " + ".join(found)


def host_info(import_torch: bool = True) -> dict[str, Any]:
    """Host name, Python, the CPU, how many CPUs are usable here, and (from torch) its version, the
    instruction set ATen's kernels use (`isa`) and the GPUs.

    With `import_torch=False`, torch is asked only if this process has already imported it, so a light
    process (a report, a listing) stays light; its torch fields are then None.
    """
    info: dict[str, Any] = {"hostname": platform.node(), "python": platform.python_version(),
                            "cpu": cpu_model(), "cpus": usable_cpus(), "instruction_sets": instruction_sets(),
                            "torch": None, "isa": None, "gpus": 0, "gpu_name": None}
    torch = sys.modules.get("torch")
    if torch is None and import_torch:
        import torch
    if torch is None:
        return info
    info["torch"] = torch.__version__
    try:
        info["isa"] = torch.backends.cpu.get_cpu_capability()
        if torch.cuda.is_available():
            info["gpus"] = torch.cuda.device_count()
            info["gpu_name"] = torch.cuda.get_device_name(0)
    except Exception:  # a broken driver must not fail a report
        pass
    return info


def describe_host(info: dict[str, Any] | None = None) -> str:
    """One line: CPU model, usable CPUs, ATen's instruction set, torch version, GPUs if any."""
    info = info or host_info()
    parts = [info["cpu"], f"{info['cpus']} CPUs"]
    if info.get("isa"):
        parts.append(f"native ATen capability {info['isa']}")
    if info.get("torch"):
        parts.append(f"torch {info['torch']}")
    if info.get("gpus"):
        parts.append(f"{info['gpus']} x {info['gpu_name']}")
    return ", ".join(parts)
