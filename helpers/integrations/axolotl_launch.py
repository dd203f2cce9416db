"""Notebook 09's kernel side of Axolotl: the environment its ranks run in, the paths its YAML names, the
settings only Axolotl adds, and Axolotl's own Ray path.

Axolotl lives in an environment of its own (`.venv-axolotl`, from envs/axolotl/requirements.lock): its last
release for transformers 4.57 pins TRL 0.27 and datasets 4, which the rest of the gallery has moved past. The
kernel runs in the gallery's environment, writes the YAML and launches; the ranks run with Axolotl's
interpreter (the launch option `python=`) and the gallery's Axolotl plugin (`helpers.integrations.axolotl`).
Both environments hold the same torch, so the process group, the tensors and the adapter files mean the same
on both sides.

Nothing here imports Axolotl: the kernel cannot. Imported first, it leaves out tqdm's notice that ipywidgets
is missing, which importing transformers prints in a notebook: this kernel draws no tqdm bar (rank 0's
progress bar comes from helpers.progress).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.paths import ROOT

warnings.filterwarnings("ignore", message="IProgress not found")

AXOLOTL_VERSION = "0.13.2"
# The packages whose versions the two environments are compared on.
PACKAGES = ("axolotl", "torch", "transformers", "trl", "peft", "datasets", "accelerate")
# check_settings(needs_gpus=...): why notebook 09 cannot train on a Ray cluster without GPUs.
RAY_NEEDS_GPUS = (
    "With `cluster` set, this notebook trains with Axolotl's own Ray path (use_ray: true), and Axolotl "
    f"{AXOLOTL_VERSION} asks every Ray worker for a GPU (ScalingConfig(use_gpu=True)): on a cluster without "
    "GPUs its workers are never placed and the run waits for them forever. Run with cluster=None (this "
    "machine's CPUs or GPUs), or on a Ray cluster with GPUs.")
# What every rank inherits from the kernel (and, on Ray, gets through the job's runtime_env): Axolotl's
# telemetry off and its logging down to errors (its INFO lines repeat the whole configuration, once per rank;
# what it did is read back from the plugin's record); no tokenizer thread pools (the ranks start after the
# kernel tokenized); no dataset progress bars (rank 0's bar is the gallery's); a deprecation notice from
# inside a dependency left out.
RANK_SETTINGS = {
    "AXOLOTL_DO_NOT_TRACK": "1",
    "AXOLOTL_LOG_LEVEL": "ERROR",
    "LOG_LEVEL": "ERROR",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore:`torch.jit.script` is deprecated:FutureWarning",
}
# Set as well where they apply: see axolotl_environment.
CONDITIONAL_SETTINGS = ("DS_ACCELERATOR", "HF_HUB_OFFLINE")


@dataclass(frozen=True)
class AxolotlEnvironment:
    """Axolotl's interpreter, and the versions both environments hold."""

    python: str
    versions: Any   # a DataFrame: one row per package, a column per environment


def find_interpreter(python: str | None = None) -> str:
    """The python of Axolotl's environment: `python` (a path or a command on PATH), else this checkout's
    `.venv-axolotl`; FileNotFoundError saying how to build it when it is missing."""
    if python is None:
        python = str(ROOT / ".venv-axolotl" / "bin" / "python")
    python = shutil.which(python) or python
    if not Path(python).is_file():
        raise FileNotFoundError(
            f"Axolotl's environment is not built ({python} is missing): run `make venv-axolotl` in the "
            "checkout (about a minute; `make run` and `make test` build it too), or pass axolotl_python= the "
            f"python of an environment where axolotl=={AXOLOTL_VERSION} is installed.")
    return python


def versions_of(python: str, packages: Sequence[str] = PACKAGES) -> dict[str, str]:
    """The installed versions of `packages` in `python`'s environment, read without importing them (importing
    Axolotl takes seconds)."""
    probe = ("import json, importlib.metadata as m; "
             f"print(json.dumps({{p: m.version(p) for p in {list(packages)!r}}}))")
    found = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if found.returncode:
        last = (found.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{python} cannot report Axolotl's version: {last}. Rebuild the environment: "
                           "`make clean-venv-axolotl venv-axolotl`.")
    return json.loads(found.stdout)


def rank_settings(model_name: str | None, cuda: bool) -> dict[str, str]:
    """RANK_SETTINGS, plus: a local model (or the built-in one, `model_name=None`) means the ranks never ask
    the hub (Axolotl's rank 0 would ask it who the user is); without CUDA, DeepSpeed's accelerator probe,
    which transformers imports, is told it is on the CPU."""
    settings = dict(RANK_SETTINGS)
    if model_name is None or Path(model_name).is_dir():
        settings["HF_HUB_OFFLINE"] = "1"
    if not cuda:
        settings["DS_ACCELERATOR"] = "cpu"
    return settings


def axolotl_environment(python: str | None = None, *, model_name: str | None = None) -> AxolotlEnvironment:
    """Find Axolotl's interpreter, compare its versions with this kernel's, and set what the ranks inherit.

    Call it before the first launch: the settings (`rank_settings`) go into this process's environment,
    which every rank started from here inherits (kept where the user already set them).
    """
    import importlib.metadata

    import pandas as pd
    import torch

    python = find_interpreter(python)
    ranks = versions_of(python)
    for name, value in rank_settings(model_name, torch.cuda.is_available()).items():
        os.environ.setdefault(name, value)
    here = {p: (importlib.metadata.version(p) if p != "axolotl" else "-") for p in ranks}
    versions = pd.DataFrame({"Axolotl's environment (the ranks)": ranks, "this kernel": here})
    return AxolotlEnvironment(python, versions)


def for_ranks(path: str | os.PathLike, cluster: str | None = None) -> str:
    """A path as the YAML names it: relative to the kernel's folder, which the ranks share on one machine (the
    YAML stays readable, this machine's folders out of it); absolute on a Ray cluster, whose workers run in
    folders of their own (on storage every node sees). A hub id (no such file or folder) stays as it is."""
    path = str(path)
    if not (Path(path).exists() or Path(path).parent.exists()):
        return path
    return str(Path(path).resolve()) if cluster is not None else os.path.relpath(path)


def check_lora_targets(config: Any, targets: Sequence[str] | None) -> None:
    """Every name in `targets` (LoRA's target modules; None: every linear layer) must be a module of the model
    `config` describes, checked on a copy on the meta device (nothing allocated)."""
    if targets is None:
        return
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = {n.rsplit(".", 1)[-1]: type(m) for n, m in model.named_modules()}
    missing = [t for t in targets if t not in names]
    if missing:
        linear = sorted(n for n, kind in names.items() if kind is torch.nn.Linear)
        raise ValueError(f"lora_target_modules: {missing} match no module of this model; its linear layers "
                         f"are {linear}.")


def seen_on_every_gpu_node(ray: Any, shared: Any) -> None:
    """Axolotl starts the Ray workers itself, so they cannot check the paths the kernel marked: a Ray task on
    every GPU node does, before the launch (`shared`: what `helpers.shared_storage.shared_paths` marked)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from helpers.shared_storage import SharedStorageError

    @ray.remote(num_cpus=0)
    def unseen(marks: list[tuple[str, str, str | None, int | None]]) -> list[str]:
        import os

        return [f"{name}={path}" for name, path, marker, size in marks if not (
            os.path.isfile(marker) if marker else os.path.isfile(path) and os.path.getsize(path) == size)]

    marks = [(p.name, p.path, p.marker, p.size) for p in shared.paths]
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("GPU")]
    found = ray.get([unseen.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))
                     .remote(marks) for node in nodes])
    for node, missing in zip(nodes, found, strict=True):
        if missing:
            raise SharedStorageError(f"Ray node {node} cannot see {', '.join(missing)}: the YAML, the data, "
                                     "the model and output_dir must be on storage every node reaches (NFS, "
                                     "a mounted bucket).")


def train_on_ray(python: str, config_path: str | os.PathLike, cluster: str, *, processes: int,
                 output_dir: str | os.PathLike, shared: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`axolotl train olmo3-lora.yml --use-ray --ray-num-workers <processes>`: Axolotl's CLI in its own
    environment starts the ranks as Ray Train workers on `cluster` (RAY_ADDRESS), one GPU each (Axolotl's
    `resources_per_worker`), and each rank's record comes back through `output_dir` (the plugin writes it
    there). The workers get the kernel's rank settings (the job's runtime_env) and this checkout on their path
    (the CLI's working folder). `shared`: every path the ranks
    read or write, checked on every GPU node first. Returns one record per rank, in rank order.
    """
    from helpers.launch import ray_session
    from helpers.shared_storage import shared_paths

    names = (*RANK_SETTINGS, *CONDITIONAL_SETTINGS)
    job = {"runtime_env": {"env_vars": {k: os.environ[k] for k in names if k in os.environ}}}
    env = dict(os.environ, RAY_JOB_CONFIG_JSON_ENV_VAR=json.dumps(job),
               **({} if cluster == "auto" else {"RAY_ADDRESS": cluster}))
    for stale in Path(output_dir).glob("gallery-record-rank*.json"):
        stale.unlink()
    with shared_paths(**shared) as marked:
        with ray_session(cluster) as ray:
            seen_on_every_gpu_node(ray, marked)
        # `axolotl train`'s --use-ray --ray-num-workers, as this module's CLI (fire) takes them
        command = [python, "-m", "axolotl.cli.train", str(config_path), "--use_ray=True",
                   f"--ray_num_workers={processes}"]
        with subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) as run:
            for line in run.stdout or ():
                sys.stdout.write(line)
    if run.returncode:
        raise RuntimeError(f"`axolotl train` on the Ray cluster failed (exit status {run.returncode}): its "
                           "output is above")
    return read_records(output_dir, processes)


def read_records(output_dir: str | os.PathLike, processes: int) -> list[dict[str, Any]]:
    """The records the plugin's Ray workers wrote into `output_dir` (gallery-record-rank<N>.json), in rank
    order, removed once read; RuntimeError unless every one of `processes` ranks left its own."""
    records = sorted(Path(output_dir).glob("gallery-record-rank*.json"),
                     key=lambda p: int(p.stem.rsplit("rank", 1)[1]))
    found = [json.loads(p.read_text()) for p in records]
    for p in records:
        p.unlink()
    if len(found) != processes:
        raise RuntimeError(f"{len(found)} of the {processes} Ray workers left their record in output_dir="
                           f"{output_dir}: is it on storage every node reaches?")
    return found


def hold_out(data_path: str | os.PathLike, n_test: int, seed: int,
             folder: str | os.PathLike) -> tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]:
    """A user's chat file split for Axolotl, which reads its training data from a file: every line checked
    (`validate_sft_jsonl`), `n_test` conversations of a seeded shuffle held out, the rest written to
    `folder/train.jsonl`. Returns that file, the training rows and the held-out rows."""
    import random

    from helpers.data.sft_tasks import validate_sft_jsonl

    rows = validate_sft_jsonl(data_path)
    if len(rows) <= n_test:
        raise ValueError(f"{data_path} has {len(rows)} conversations: it needs more than n_test={n_test}.")
    random.Random(seed).shuffle(rows)
    train_rows, test_rows = rows[n_test:], rows[:n_test]
    train_path = Path(folder) / "train.jsonl"
    train_path.parent.mkdir(parents=True, exist_ok=True)
    train_path.write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    return train_path, train_rows, test_rows
