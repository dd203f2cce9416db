"""The shared `precision` parameter: what runs where, and what is refused before any launch."""

import pytest
import torch

from helpers.precision import check_precision, resolve_precision


def test_auto_on_cpu_is_fp32():
    p = resolve_precision("auto", "cpu")
    assert (p.name, p.autocast_dtype, p.scaler, p.lightning) == ("fp32", None, False, "32-true")


def test_bf16_on_cpu_autocasts_without_scaler():
    p = resolve_precision("bf16", "cpu")
    assert p.autocast_dtype is torch.bfloat16 and not p.scaler and p.lightning == "bf16-mixed"


@pytest.mark.parametrize("bad, message", [("float16", "use one of 'auto', 'bf16', 'fp16', 'fp32'"),
                                          ("fp16", "needs a GPU")])
def test_refused_on_cpu(bad, message):
    with pytest.raises(ValueError, match=message):
        check_precision(bad, "cpu")


def test_fp16_is_allowed_on_a_gpu_plan():
    check_precision("fp16", "cuda")   # decided in the rank, where the GPU is


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_auto_on_a_gpu():
    p = resolve_precision("auto", "cuda:0")
    assert p.name == ("bf16" if torch.cuda.is_bf16_supported() else "fp16")
