"""Per-GPU memory of model state (parameters, gradients, optimizer state) for each way of training a model.

Why: which technique a model needs (DDP, FSDP, DeepSpeed ZeRO 1/2/3, ZeRO with CPU offload; full fine-tuning,
LoRA or QLoRA) follows from a few bytes a parameter and how each technique splits them over the GPUs. The
parameter counts come from the model itself: it is built on the `meta` device (shapes, no memory) from its
configuration, and a LoRA configuration is applied to it with peft, so the trainable count is peft's own.
Nothing here is a typed-in share or parameter count.

    counts = count_parameters(real_config("gpt-oss-120b"), lora=real_lora("gpt-oss-120b"))
    model_state_bytes(counts, "fsdp", world_size=8).as_gb()
    which_technique(counts, world_size=8, gpu_gb=80)

    python -m helpers.memory_plan --models all --gpus 8 --gpu-gb 80     # the table, in markdown

Bytes a parameter, mixed precision as the notebooks train (bf16 compute, fp32 master weights, AdamW):

* PyTorch's own wrappers (DDP, FSDP2) keep what is trained in fp32: the parameter 4 B, its gradient 4 B,
  Adam's two moments 8 B (FSDP2's sharded parameter is the fp32 master; it gathers a bf16 copy to compute).
* DeepSpeed ZeRO keeps 16-bit parameters 2 B and gradients 2 B, and an optimizer state of an fp32 master
  copy 4 B plus the moments 8 B (the ZeRO paper's K = 12): the same 16 B in all.
* A frozen parameter (LoRA's base weights) is only stored: 2 B in bf16, or NF4 4-bit (QLoRA: the weights of
  the linear layers but the output head, as bitsandbytes converts them; the rest stays bf16).
* LoRA's adapters are trained like any parameter (peft keeps them in fp32 beside a bf16 base).

How each technique splits them over N GPUs (T trainable, W the frozen weights' bytes):

    DDP               every GPU: all of it
    ZeRO-1            optimizer state / N
    ZeRO-2            optimizer state and gradients / N
    ZeRO-3, FSDP      everything / N, plus the unit being computed, gathered in 16 bits
    ZeRO-2 + offload  parameters on every GPU; gradients and optimizer state (fp32) in CPU memory
    ZeRO-3 + offload  parameters / N on the GPUs (plus the gathered unit); the rest in CPU memory

The gathered unit of FSDP and ZeRO-3 is the largest repeated block (a transformer layer) plus what lies
outside the blocks (embeddings, final norm, head): FSDP2 keeps the root's parameters gathered through forward
and backward when each block and then the whole model are wrapped, as notebook 04 does. ZeRO-3 gathers
module by module, so there this is an upper bound.

Not counted: activations (they depend on batch and sequence length), communication buckets, the CUDA context,
autocast's cached bf16 copies of the weights, allocator fragmentation. `which_technique` keeps a share of
each GPU (`headroom`) for them. GB here are 1e9 bytes.

Where each part lives (every name stays importable from here):

    helpers.param_counts       a model counted on the meta device: ParamCounts, count_parameters,
                               count_real_model, MODES, the bytes of a bf16 and an NF4 weight
    helpers.published_models   the published configurations and the notebooks' LoRA settings: REAL_MODELS,
                               real_config, real_lora
    helpers.technique_plan     the bytes under each technique and the advice: model_state_bytes,
                               fsdp_with_layers_in_flight (FSDP's layers in flight), which_technique,
                               technique_table, markdown_table
    helpers.memory_plan        this command line and the README's table
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from helpers.param_counts import BF16_BYTES, MODES, NF4_BYTES, ParamCounts, count_parameters, count_real_model
from helpers.published_models import REAL_MODELS, RealModel, real_config, real_lora
from helpers.technique_plan import (
    DEFAULT_HEADROOM,
    GB,
    OPTIMIZER_STATE_BYTES,
    TECHNIQUES,
    Advice,
    MemoryEstimate,
    fsdp_with_layers_in_flight,
    markdown_table,
    model_state_bytes,
    technique_table,
    which_technique,
)

__all__ = [
    # helpers.param_counts
    "BF16_BYTES", "MODES", "NF4_BYTES", "ParamCounts", "count_parameters", "count_real_model",
    # helpers.published_models
    "REAL_MODELS", "RealModel", "real_config", "real_lora",
    # helpers.technique_plan
    "DEFAULT_HEADROOM", "GB", "OPTIMIZER_STATE_BYTES", "TECHNIQUES", "Advice", "MemoryEstimate",
    "fsdp_with_layers_in_flight", "markdown_table", "model_state_bytes", "technique_table", "which_technique",
    # here: the command line and the README's table
    "README_ARGS", "README_MARKERS", "main", "readme_table", "write_readme",
]


# The README's figures: this command's table, between these markers (tests/test_memory_plan.py holds them
# equal; `python -m helpers.memory_plan --write-readme` rewrites them)
README_ARGS = ("--models", "all", "--modes", "full,lora", "--techniques", "ddp,fsdp,zero3_offload", "--brief")
README_MARKERS = ("<!-- technique-figures -->", "<!-- /technique-figures -->")

BRIEF_DROPS = ("parameters (B)", "trainable (M)", "offload CPU, all ranks")


def _names(text: str, known: Sequence[str], what: str) -> list[str]:
    names = list(known) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise ValueError(f"--{what} {text!r}: use 'all' or a comma-separated list of {', '.join(known)}.")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m helpers.memory_plan",
        description="Per-GPU memory of model state (parameters, gradients, optimizer state; bf16 mixed "
                    "precision, AdamW) for each technique and way of training the published models, counted "
                    "on the meta device. Prints a markdown table in GB (1e9 bytes); ✗ marks a figure over "
                    "the budget (the GPU's memory less the headroom kept for activations).",
        epilog="example: python -m helpers.memory_plan --models gpt-oss-20b,gpt-oss-120b --gpus 8 "
               "--gpu-gb 80")
    parser.add_argument("--models", default="all",
                        help=f"'all' or a comma-separated list of {', '.join(REAL_MODELS)}")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs (processes) to train on (default 8)")
    parser.add_argument("--gpu-gb", type=float, default=80.0, help="memory of each GPU in GB (default 80)")
    parser.add_argument("--modes", default="all",
                        help=f"'all' or a comma-separated list of {', '.join(MODES)}")
    parser.add_argument("--optimizer", default="adamw", choices=list(OPTIMIZER_STATE_BYTES))
    parser.add_argument("--headroom", type=float, default=DEFAULT_HEADROOM,
                        help=f"share of each GPU kept for activations (default {DEFAULT_HEADROOM})")
    parser.add_argument("--techniques", default="all",
                        help=f"'all' or a comma-separated list of {', '.join(TECHNIQUES)}")
    parser.add_argument("--brief", action="store_true",
                        help="the GB columns and the advice only (no sizes, no offload CPU column)")
    parser.add_argument("--write-readme", action="store_true",
                        help="write the README's table (its own options: " + " ".join(README_ARGS) + ")")
    parser.add_argument("--cpu-gb", type=float, default=None,
                        help="CPU memory of the machine in GB: advise offload only where it fits "
                             "(default: not checked)")
    args = parser.parse_args(argv)
    if args.write_readme:
        return write_readme()
    from helpers.logs import drop_import_notices

    drop_import_notices()  # transformers' and peft's dependencies announce kernels a count never uses
    try:
        models = _names(args.models, list(REAL_MODELS), "models")
        modes = _names(args.modes, list(MODES), "modes")
        if args.gpus < 1:
            raise ValueError(f"--gpus {args.gpus}: give the number of GPUs, 1 or more.")
        techniques = _names(args.techniques, list(TECHNIQUES), "techniques")
        rows = technique_table(models, args.gpus, args.gpu_gb, modes, techniques, optimizer=args.optimizer,
                               headroom=args.headroom, cpu_gb=args.cpu_gb)
    except ValueError as e:
        parser.error(str(e))
    if args.brief:
        rows = [{k: v for k, v in row.items() if k not in BRIEF_DROPS} for row in rows]
    budget = args.gpu_gb * (1 - args.headroom)
    print(f"Model state per GPU, GB, on {args.gpus} GPUs of {args.gpu_gb:g} GB ({args.optimizer}, bf16 "
          f"mixed precision; ✗: over {budget:.1f} GB, what a GPU keeps beside {args.headroom:.0%} for "
          "activations):\n")
    print(markdown_table(rows, args.gpu_gb, args.headroom))
    return 0


def readme_table() -> str:
    """The table `python -m helpers.memory_plan` prints with README_ARGS."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(list(README_ARGS))
    return out.getvalue().split("\n\n", 1)[1].strip()


def write_readme(readme: Path | None = None) -> int:
    from helpers.paths import ROOT

    readme = readme or ROOT / "README.md"
    start, end = README_MARKERS
    text = readme.read_text()
    if text.count(start) != 1 or text.count(end) != 1:
        raise SystemExit(f"{readme}: expected one {start} and one {end} around the table; put them back "
                         "first.")
    head, rest = text.split(start)
    readme.write_text(f"{head}{start}\n{readme_table()}\n{end}{rest.split(end, 1)[1]}")
    print(f"wrote the model-state table into {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
