"""Each notebook's "scale up" run: the one parameter set that its text and the tests share.

The gallery promises that every lesson runs at full size by changing parameters only. That promise is only
as good as the commands we print, so they are written once, here: the notebooks' "Scaling up" sections are
checked against these sets (tests/test_scale_up.py), the README's gallery table links each of those sections
under the set's `where`, and the same test executes every notebook with them, on local stand-ins of the real
data and with a step cap.

    python -m helpers.gallery --scale-up          # every notebook's command, as the notebooks print it
    python -m helpers.gallery --scale-up 04       # one notebook's
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ScaleUp:
    notebook: str                 # the notebook's stem, e.g. "04_fsdp_transformer"
    where: str                    # the machine the command is meant for: the README's link text
    parameters: dict[str, Any]    # papermill parameters, in the order they are printed


SCALE_UPS: dict[str, ScaleUp] = {s.notebook: s for s in [
    ScaleUp("01_ddp_mlp", "on 8 GPUs", {"batch_size": 512, "lr": 0.4, "epochs": 30}),
    ScaleUp("02_ddp_retinanet", "on 8 GPUs, COCO 2017", {
        "backbone": "resnet50_fpn_v2", "fpn_channels": 256, "anchor_size": 32,
        "anchor_ratios": [0.5, 1.0, 2.0], "image_size": 800, "batch_size": 64, "lr": 0.0005, "epochs": 26,
        "warmup_steps": 1000, "data_path": "/data/coco", "weights_path": "/models/resnet50-11ad3fa6.pth",
        "num_workers": 8}),
    ScaleUp("03_lightning_two_tower_mds", "on 8 GPUs, MovieLens 25M", {
        "data_path": "/data/ml-25m", "batch_size": 8192, "embed_dim": 128, "lr": 0.002, "epochs": 5,
        "shard_size": "64mb", "eval_users": 10000, "tracking_uri": "http://mlflow.example:5000",
        "run_parity": False}),
    ScaleUp("04_fsdp_transformer", "on 8 GPUs", {
        "preset": "10M", "steps": 5000, "batch_size": 256, "lr": 0.001, "checkpoint_every": 500,
        "fail_at_step": None, "output_dir": "/shared/ckpt/run1"}),
    ScaleUp("05_deepspeed_zero_sft", "on 8 GPUs, Llama 3.2 1B", {
        "model_name": "/models/Llama-3.2-1B-Instruct", "data_path": "my_chats.jsonl", "zero_stage": 3,
        "batch_size": 64, "lr": 2e-5, "epochs": 2, "max_length": 1024, "output_dir": "/models/llama-sft",
        "run_parity": False}),
    ScaleUp("06_ray_train_resnet", "on a Ray cluster with 8 GPUs", {
        "cluster": "auto", "processes": 8, "data_path": "/shared/data", "n_train": 55000,
        "n_val": 5000, "n_test": 10000, "epochs": 20, "batch_size": 512, "lr": 0.2,
        "fail_at_epoch": None, "output_dir": "/shared/ray-results", "tracking_uri": "http://mlflow.example:5000"}),
    ScaleUp("07_trl_sft_gpt_oss", "on 8 GPUs, gpt-oss-120b", {
        "model_name": "openai/gpt-oss-120b", "strategy": "fsdp", "peft": "lora",
        "data_path": "my_chats.jsonl",
        "batch_size": 32, "lr": 0.0002, "epochs": 1, "max_length": 2048, "gradient_checkpointing": True,
        "run_parity": False, "output_dir": "/models/gpt-oss-120b-lora"}),
    ScaleUp("08_unsloth_llama", "on 8 GPUs, Llama 3.2 3B in 4 bits", {
        "model_name": "unsloth/Llama-3.2-3B-Instruct", "data_path": "my_chats.jsonl", "batch_size": 16,
        "lr": 0.0002, "epochs": 1, "max_length": 2048, "output_dir": "/models/llama-3.2-3b-lora"}),
    ScaleUp("09_axolotl_olmo3", "on 8 GPUs, OLMo 3 7B with QLoRA", {
        "model_name": "allenai/Olmo-3-7B-Instruct", "data_path": "my_chats.jsonl", "batch_size": 16,
        "lr": 0.0002, "epochs": 1, "max_length": 2048, "gradient_checkpointing": True,
        "output_dir": "/models/olmo-3-7b-qlora"}),
    ScaleUp("10_fast_and_elastic", "on 8 GPUs", {
        "preset": "10M", "steps": 200, "batch_size": 256, "micro_batches": 8, "lr": 0.02, "straggler_ms": 0,
        "resume_world_sizes": [1, 4], "output_dir": "/shared/nb10"}),
]}


def _cli_value(value: Any) -> str:
    """A value as papermill's `-p` reads it back (True/False/None, ints and floats are converted)."""
    if isinstance(value, float):
        return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m[1].replace("+", "") + m[2], repr(value))  # 2e-5
    return str(value)


def parameter_args(parameters: dict[str, Any]) -> list[str]:
    """papermill arguments for `parameters`: `-p NAME VALUE`, or `-y 'NAME: [...]'` for lists and dicts.

    `-p` gives a list as a string ("[0.5, 1.0, 2.0]"), so lists and dicts travel as YAML, which papermill
    parses.
    """
    import json

    args: list[str] = []
    for name, value in parameters.items():
        if isinstance(value, (list, tuple, dict)):
            args += ["-y", f"{name}: {json.dumps(value)}"]
        else:
            args += ["-p", name, _cli_value(value)]
    return args


def _quote(args: list[str]) -> list[str]:
    return [shlex.quote(a) for a in args]


def inline(notebook: str) -> str:
    """The parameters alone, on one line, as a user types them after `papermill IN OUT`."""
    return " ".join(_quote(parameter_args(SCALE_UPS[notebook].parameters)))


def command(notebook: str, width: int = 110) -> str:
    """The papermill command the notebook's "Scaling up" section prints, wrapped with backslashes."""
    words = ["papermill", f"notebooks/{notebook}.ipynb", "out.ipynb"]
    pairs = [" ".join(_quote(parameter_args({k: v}))) for k, v in SCALE_UPS[notebook].parameters.items()]
    lines, line = [], " ".join(words)
    for pair in pairs:
        if len(line) + 1 + len(pair) + 2 > width:
            lines.append(line + " \\")
            line = "    " + pair
        else:
            line += " " + pair
    lines.append(line)
    return "\n".join(lines)


def _resolve_type(value: str) -> Any:
    """papermill's `-p` conversion (its cli._resolve_type, 2.7): True/False/None, int, float, else text."""
    if value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[value]
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def parse_parameters(text: str) -> dict[str, Any]:
    """What a papermill command line (or a README fragment of one) passes, read as papermill reads it."""
    import yaml

    words = shlex.split(text.replace("\\\n", " "))
    found: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-p", "--parameters"):
            found[words[i + 1]] = _resolve_type(words[i + 2])
            i += 3
        elif word in ("-r", "--parameters_raw"):
            found[words[i + 1]] = words[i + 2]
            i += 3
        elif word in ("-y", "--parameters_yaml"):
            found.update(yaml.safe_load(words[i + 1]))
            i += 2
        else:
            i += 1
    return found


def cli_parameters(notebook: str) -> dict[str, Any]:
    """What a user who types the printed command really passes to the notebook (parsed back by papermill)."""
    return parse_parameters(inline(notebook))
