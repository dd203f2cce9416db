"""The `precision` parameter every training notebook shares: what it means on this device.

`"auto"` is bf16 autocast on GPUs that support it (Ampere and later), fp16 autocast with a gradient scaler
on older GPUs, and fp32 on CPU; `"bf16"`, `"fp16"` and `"fp32"` ask for one. The notebooks write the
autocast and `GradScaler` code themselves, where the reader sees it; this module only decides, and
refuses what cannot work before any process starts (fp16 on a CPU: autocast to fp16 is a GPU feature,
and a gradient scaler exists for fp16's narrow range).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHOICES = ("auto", "bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Precision:
    name: str  # "bf16", "fp16" or "fp32": what runs
    autocast_dtype: Any  # torch.bfloat16 / torch.float16, or None for fp32 (autocast off)
    scaler: bool  # fp16 needs a GradScaler; bf16 has fp32's range and does not

    @property
    def lightning(self) -> str:
        """The same choice as Lightning's `precision=` string."""
        return {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}[self.name]


def check_precision(precision: str, device: str) -> None:
    """On the driver, before any launch: an unknown name, or fp16 on a CPU, fails with the fix."""
    if precision not in CHOICES:
        raise ValueError(f"precision={precision!r}: use one of {', '.join(map(repr, CHOICES))}.")
    if device == "cpu" and precision == "fp16":
        raise ValueError("precision='fp16' needs a GPU (fp16 autocast and its GradScaler are GPU features): "
                         "use 'bf16', 'fp32' or 'auto' on CPU.")


def resolve_precision(precision: str, device: Any) -> Precision:
    """In a rank: the precision that runs on its device (`"auto"` decided by the GPU's capability)."""
    import torch

    device = torch.device(device)
    check_precision(precision, device.type)
    name = precision
    if precision == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:
            name = "fp32"
    if name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision='bf16' but {torch.cuda.get_device_name(device)} has no bf16 support: "
                         "use 'fp16' (with its GradScaler) or 'auto'.")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[name]
    return Precision(name=name, autocast_dtype=dtype, scaler=name == "fp16")
