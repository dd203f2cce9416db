"""The settings check every lesson makes first: a bad parameter fails in seconds, with the fix, before any
data is built, any model loaded or any process started.

The gallery's parameters have one name per meaning (tests/test_notebook_conventions.py holds it), so one
check per name serves every notebook: `check_settings(parameters_as_run())` checks each name it knows that
the notebook has, and returns the launch plan (on a Ray cluster, for the cluster's GPUs). What only one
notebook has (a ZeRO stage, an FSDP strategy) is checked there, with `check_choice` or `check_whole`, beside
it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers.launch import LaunchOptions, LaunchPlan, plan_launch
from helpers.launch.options import RAY

TASKS = ("reverse", "sort", "add")   # helpers.data.sft_tasks' built-in tasks
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
WHOLE = ("epochs", "steps", "batch_size", "max_length", "n_train", "n_val", "n_test", "parity_steps",
         "layers", "hidden_size")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_whole(name: str, value: Any, minimum: int = 1, hint: str = "") -> None:
    """A whole number of at least `minimum` (True and 2.0 are refused: papermill passes them as written)."""
    if not _whole(value) or value < minimum:
        raise ValueError(f"{name}={value!r}: use a whole number of {minimum} or more{hint}.")


def check_choice(name: str, value: Any, choices: Sequence[Any], meaning: str = "") -> None:
    """One of `choices`, of the same type (True is not 1, "True" is not True)."""
    if not any(value is c or (type(value) is type(c) and value == c) for c in choices):
        raise ValueError(f"{name}={value!r}: use one of {', '.join(map(repr, choices))}{meaning}.")


def check_lora(r: Any, alpha: Any, target_modules: Any, *, none_means: str | None = None) -> None:
    """LoRA's rank, scale and target modules; `none_means`: what target_modules=None does, where allowed."""
    if not _whole(r) or r < 1:
        raise ValueError(f"lora_r={r!r}: a LoRA rank is a whole number of 1 or more (8, 16, 32 and 64 are "
                         "usual; higher adapts more and trains more parameters).")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha <= 0:
        raise ValueError(f"lora_alpha={alpha!r}: use a positive number (usually lora_r or 2 * lora_r).")
    if target_modules is None and none_means is not None or target_modules == "all-linear":
        return
    if isinstance(target_modules, str) or not target_modules:
        raise ValueError(f"lora_target_modules={target_modules!r}: give a list of module names, such as "
                         "['q_proj', 'v_proj'] (with papermill: -y \"lora_target_modules: [q_proj, v_proj]\")"
                         + (f", or None for {none_means}." if none_means else "."))


def check_local_checkpoint(model_name: str | None) -> None:
    """A local folder given as `model_name` must hold what `from_pretrained` reads: config and tokenizer."""
    if model_name is None or not Path(model_name).is_dir():
        return   # None (the built-in model) or a hub id, which the machine may be able to download
    folder = Path(model_name)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model_name={model_name!r} has no config.json: point it at the folder "
                                "save_pretrained wrote (or a hub id on a machine that can download).")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise FileNotFoundError(f"model_name={model_name!r} holds a model but no tokenizer (tokenizer.json "
                                "or tokenizer_config.json): copy the tokenizer files of the same checkpoint "
                                "into it.")


def check_data_path(data_path: str | None, holds: str) -> None:
    """`data_path`, where given, must exist; `holds` says what the notebook reads there."""
    if data_path is not None and not Path(data_path).exists():
        raise FileNotFoundError(f"data_path={data_path!r} does not exist: give {holds}, or None for the "
                                "built-in data.")


def plan_ranks(processes: Any, cluster: str | None = None, *, needs_gpus: str | None = None) -> LaunchPlan:
    """What the launches will start: on this machine, or on the Ray cluster for its GPUs.

    `needs_gpus`: why the notebook cannot run on a Ray cluster without GPUs, when it cannot (refused up front
    instead of waiting forever for workers that are never placed).
    """
    if cluster is None:
        return plan_launch(LaunchOptions(processes=processes))
    from helpers.launch import ray_session

    with ray_session(cluster) as ray:
        gpus = int(ray.cluster_resources().get("GPU", 0))
    if needs_gpus and not gpus:
        raise RuntimeError(f"cluster={cluster!r}: this Ray cluster has no GPU. {needs_gpus}")
    return plan_launch(LaunchOptions(processes=processes, cluster=cluster), gpus=gpus, target=RAY)


def check_settings(params: Mapping[str, Any], *, needs_gpus: str | None = None,
                   lora_targets_none: str | None = None) -> LaunchPlan:
    """Check every parameter of the gallery's vocabulary that `params` has; return the launch plan.

    Call it with `parameters_as_run()` in the cell after the imports, before any data is built.
    `needs_gpus`: see `plan_ranks`. `lora_targets_none`: what `lora_target_modules=None` means in this
    notebook, where None is allowed.
    """
    from helpers import tracking
    from helpers.precision import check_precision
    from helpers.step_cap import check_max_steps

    check_max_steps(params.get("max_steps"))
    tracking.check_register_as(params.get("register_as"))
    for name in WHOLE:
        if name in params:
            check_whole(name, params[name])
    if "lr" in params and (isinstance(params["lr"], bool) or not isinstance(params["lr"], (int, float))
                           or params["lr"] <= 0):
        raise ValueError(f"lr={params['lr']!r}: use a positive learning rate, such as 1e-3.")
    if "task" in params and params.get("data_path") is None:
        check_choice("task", params["task"], TASKS, " (or give data_path)")
    if "lora_r" in params:
        check_lora(params["lora_r"], params.get("lora_alpha"), params.get("lora_target_modules"),
                   none_means=lora_targets_none)
    check_local_checkpoint(params.get("model_name"))
    plan = plan_ranks(params.get("processes", "auto"), params.get("cluster"), needs_gpus=needs_gpus)
    batch_size = params.get("batch_size")
    if batch_size is not None and batch_size % plan.processes:
        even = plan.processes * max(1, batch_size // plan.processes)
        raise ValueError(f"batch_size={batch_size} does not split evenly over {plan.processes} processes: "
                         f"use a multiple of {plan.processes}, such as {even}.")
    if "precision" in params:
        check_precision(params["precision"], plan.device)   # "auto" is decided in the ranks, by their GPU
    return plan
