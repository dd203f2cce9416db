"""Notebook 07's peak memory per process on a GPT-OSS-shaped checkpoint: only the loading rank holds a model.

Writes a GPT-OSS checkpoint (the real `GptOssForCausalLM`: alternating sliding/full attention, attention
sinks, top-2 routing; hidden size 256 and gpt-oss-120b's 36 layers, as many experts as `--size-mb` needs;
plain bf16 safetensors with the gallery's character tokenizer in the folder), a second one at gpt-oss-20b's
depth stored in fp32 (hidden 576, 24 layers, 16 experts: 407M parameters, 1.63 GB; `--no-deep` leaves it
out), and a tiny one of the same kind (the notebook's default shape: hidden 64, 2 layers, 4 experts). Runs
notebook 07 with `model_name=<folder>, strategy="fsdp", peft="lora", max_steps=1, run_parity=False` (LoRA
rank 2: the adapters' share of the narrow model is then near their share of gpt-oss-120b) on small data, in
both settings of `gradient_checkpointing`: True, as the advertised 120B command and the notebook's advice,
for each number of ranks in `--ranks`; False, the notebook's default, for each in `--off-ranks` (each rank
then holds about the model's expert weights besides its shard, so fewer ranks keep the runs within a small
host's memory). Each run goes first on the tiny checkpoint, then on the big one, with the environment
`make test` uses (GALLERY_TRACKING=off, no GPU). While a run goes, a thread polls every 50 ms the resident
memory (RSS, psutil) of the processes of the notebook's Jupyter kernel: the kernel itself (the process running
ipykernel) and the ranks (the children of the launcher's forkserver, a child of the kernel). Each rank is
known by the rank its own process names: the local launcher has torch elastic send every rank's output to
`<logs>/attempt_<k>/<rank>/stdout.log`, and the rank's standard output (/proc/<pid>/fd/1) is that file;
`rank_identities` checks it with a launch of its own, whose ranks report their rank, pid and that file. A
forkserver child whose output is no rank's log is no rank: it is listed (pid, command line, output), not
measured as one. One such comes with every forkserver: `/sbin/ldconfig -p`, which the server runs while it
pre-loads torch (`import torch` -> torch.cuda -> cuda.pathfinder -> `ctypes.util.find_library("dl")`), in
notebook 07 during the cells after its `preload(...)`; it lives a few ms, long enough to be sampled only
under load. Each process keeps its peak. The model memory of a process is its peak with the
big model minus its peak with the tiny one.

The verdicts (exit status 1 if one fails):

* with gradient checkpointing on, every rank but rank 0 (the one that reads the checkpoint) holds at most
  its shard of the model (the model's bytes at the training precision / N) + one gathered decoder layer (the
  largest) + PEFT's working set for LoRA on the experts, EXPERT_LORA_COPIES times that layer's expert
  weights + the LoRA adapters (made whole on every rank, 4 bytes a parameter, then sharded with their
  gradients and AdamW moments, 12 bytes / N) + RANK_SLACK_MB. What falls as 1/N is the shard; the rest does
  not grow with N.
  Why so: a rank peaks in the backward pass of a decoder layer, inside autograd. It holds that layer,
  gathered (notebook 07 turns off FSDP2's backward prefetch, which would gather the next one too: one layer
  more, measured), and what PEFT's LoRA on the experts adds: the layer's merged expert weights (W + B A over
  the stacked experts, built once per forward) and their gradient, which autograd sums expert by expert from
  full-size tensors (transformers' training loop indexes one expert at a time out of the stacked weight, and
  the gradient of an indexed slice is a tensor of the whole stack's size). Each row also prints how many
  layers' worth a rank held beyond its shard and adapters (`in_flight_layers`); notebook 07 scales that
  figure to gpt-oss-120b (from these rows only: checkpointing on is what it recommends);
* with gradient checkpointing off, the same rank holds all of the above + the merged expert weights of
  every other layer: in the forward pass PEFT builds each layer's `W + B A` and autograd keeps it until that
  layer's backward pass, so at the peak (the first layer's backward) every layer's is there at once, and
  FSDP's sharding saves nothing on them. The limit is the checkpointing-on one + (layers - 1) x the layer's
  expert weights: bounded by the model's expert weights, whatever N. Notebook 07 shows these rows as the
  cost of its default, and `helpers.models.gpt_oss.check_expert_lora_memory` warns before loading when they
  would exceed a quarter of a process's memory;
* the kernel's model memory is at most KERNEL_SLACK_MB: its peak must not grow with the model. The kernel is
  judged on the cells before the notebook's "Scaling up" section: that section builds the published
  20b/120b configurations with their LoRA adapters (`count_real_model`), whatever `model_name` is, and the
  kernel's peak there spreads by more than a GB from run to run (2.0 and 3.4 GB measured with the same tiny
  model); its peak over the whole notebook is printed too.

Rank 0's model memory is printed, not judged: it reads the whole checkpoint, so about one model + its shard.

    .venv/bin/python benchmarks/llm_memory.py [--size-mb 1500] [--ranks 2 4] [--off-ranks 2] [--no-deep]
                                              [--json PATH]
    .venv/bin/python benchmarks/llm_memory.py --rejudge PATH   # a stored run's rows and verdicts, with
                                                                # this file's limits; nothing is run

Slacks (each also printed in the output, with why):

* KERNEL_SLACK_MB = 64: with `model_name` given the kernel reads only the config and the tokenizer and
  builds meta-device models for the size table, whatever the checkpoint's size. Measured at 2 ranks: the
  kernel's peak spread by under 1 MB over three runs with the tiny model, and grew by 11 MB from the tiny to
  the 200 MB model once the kernel loaded no model; 64 MB is well above both and a sixth of the smallest
  model this runs on (200 MB in bf16, 385 MiB at the ranks' fp32).
* RANK_SLACK_MB = 128: on top of the above, activations of a short batch and allocator noise (with
  checkpointing off every layer's activations are kept, a few MB at 2 conversations of 64 tokens);
  independent of N and small against a whole-model copy at the sizes tested (one copy is >= 380 MB at 200 MB
  bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers.env import temporary_environ  # noqa: E402
from helpers.gallery.execute import execute_notebook  # noqa: E402
from helpers.gallery.notebook_io import read_metrics  # noqa: E402
from helpers.paths import NOTEBOOKS_DIR  # noqa: E402

NOTEBOOK = NOTEBOOKS_DIR / "07_trl_sft_gpt_oss.ipynb"
MB = 2**20
# the big checkpoint's width and depth: gpt-oss-120b's 36 layers, so that one layer is the share of the model
# it is there (what FSDP gathers at a time is a layer); the experts follow --size-mb
HIDDEN, LAYERS = 256, 36
TINY = {"hidden_size": 64, "layers": 2, "experts": 4}   # the notebook's own default shape
# gpt-oss-20b's 24 layers, stored in fp32 as a user's own save_pretrained does (issue 53's shape)
DEEP = {"hidden_size": 576, "layers": 24, "experts": 16}
SHAPE, DEEP_SHAPE = "36 layers, bf16 file", "24 layers, fp32 file"   # the two big checkpoints' labels
KERNEL_SLACK_MB = 64
RANK_SLACK_MB = 128
# expert-sized tensors PEFT's LoRA on the experts adds in the backward pass of a layer: the merged expert
# weights, their gradient, and the full-size tensor autograd adds one expert's share of it from (at most the
# larger of the two stacks, two thirds of the experts' weights: three in all, rounded up)
EXPERT_LORA_COPIES = 3
LORA_R, LORA_ALPHA = 2, 4
POLL_SECONDS = 0.05
# as `make test` runs the notebooks
ENVIRONMENT = {"GALLERY_TRACKING": "off", "CUDA_VISIBLE_DEVICES": ""}
# a rank's standard output under the local launcher: torch elastic's log of that (local) rank
RANK_LOG = re.compile(r"/attempt_\d+/(\d+)/stdout\.log$")
SLACK_WHY = {
    "kernel": (f"kernel slack {KERNEL_SLACK_MB} MB: with model_name the kernel reads a config and a "
               "tokenizer and builds meta-device models only; measured: under 1 MB of spread between runs, "
               "+11 MB from the tiny to the 200 MB model; 64 MB is a sixth of the smallest model tested"),
    "rank": (f"rank slack {RANK_SLACK_MB} MB (on top of shard + one layer + {EXPERT_LORA_COPIES} x its "
             "expert weights + the LoRA adapters and their state; checkpointing off: + every other layer's "
             "merged expert weights): a short batch's activations, allocator noise; none of it grows with "
             "N or is near a whole model at the sizes tested"),
}


# ---------------------------------------------------------------------------------------------- checkpoints
def experts_for(size_mb: float, hidden: int = HIDDEN, layers: int = LAYERS) -> int:
    """The expert count that brings the bf16 checkpoint closest to `size_mb` (10**6 bytes)."""
    import torch
    from transformers import GptOssForCausalLM

    from helpers.models.char_tokenizer import build_char_tokenizer
    from helpers.models.gpt_oss import gpt_oss_config

    vocab = len(build_char_tokenizer())

    def size(experts: int) -> int:
        with torch.device("meta"):
            config = gpt_oss_config(vocab, hidden_size=hidden, layers=layers, experts=experts)
            model = GptOssForCausalLM(config)
        return 2 * sum(p.numel() for p in model.parameters())

    one, two = size(1), size(2)
    return max(2, round((size_mb * 1e6 - one) / (two - one)) + 1)


def big_checkpoint(size_mb: float) -> Path:
    from helpers.models.gpt_oss import build_gpt_oss_bf16

    return build_gpt_oss_bf16(hidden_size=HIDDEN, layers=LAYERS, experts=experts_for(size_mb))


def tiny_checkpoint() -> Path:
    from helpers.models.gpt_oss import build_gpt_oss_bf16

    return build_gpt_oss_bf16(**TINY)


def deep_checkpoint() -> Path:
    from helpers.models.gpt_oss import build_gpt_oss_checkpoint

    return build_gpt_oss_checkpoint(mxfp4=False, **DEEP)


def model_figures(folder: Path, bytes_per_value: int = 4) -> dict[str, int]:
    """Parameters of a saved model (safetensors headers, nothing loaded), its bytes on disk and at the
    training precision (fp32 on CPU: 4 bytes a value), its largest decoder layer's bytes at that
    precision, and the largest layer's stacked expert weights (what LoRA on the experts adapts)."""
    import re

    from safetensors import safe_open

    values, layers, experts, on_disk = 0, {}, {}, 0
    for file in sorted(Path(folder).glob("*.safetensors")):
        on_disk += file.stat().st_size
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                n = 1
                for d in f.get_slice(name).get_shape():
                    n *= d
                values += n
                layer = re.match(r"model\.layers\.(\d+)\.", name)
                if layer:
                    layers[int(layer.group(1))] = layers.get(int(layer.group(1)), 0) + n
                expert = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$", name)
                if expert:   # the stacked expert weights LoRA adapts (the notebook's lora_target_parameters)
                    experts[int(expert.group(1))] = experts.get(int(expert.group(1)), 0) + n
    return {"parameters": values, "file_bytes": on_disk, "model_bytes": values * bytes_per_value,
            "layer_bytes": max(layers.values()) * bytes_per_value, "layers": len(layers),
            "expert_bytes": max(experts.values(), default=0) * bytes_per_value,
            "adapter_parameters": adapter_parameters(folder)}


def adapter_parameters(folder: Path) -> int:
    """The LoRA parameters notebook 07 trains on this model at LORA_R (its default targets), counted by peft
    on the meta device (helpers.memory_plan)."""
    from peft import LoraConfig
    from transformers import AutoConfig

    from helpers.memory_plan import count_parameters

    lora = LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, target_modules="all-linear", task_type="CAUSAL_LM",
                      target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    return count_parameters(AutoConfig.from_pretrained(folder), lora=lora).trainable


# ------------------------------------------------------------------------------------------------- polling
class RankCountError(RuntimeError):
    """The ranks seen were not whole launches (a rank missing, or seen twice as often as another): their
    peaks cannot be assigned."""


def stdout_rank(pid: int) -> int | None:
    """The rank whose torch elastic log is process `pid`'s standard output (None: no rank's log, or gone)."""
    try:
        found = RANK_LOG.search(os.readlink(f"/proc/{pid}/fd/1"))
    except OSError:
        return None
    return int(found[1]) if found else None


class TreePeaks:
    """Polls, every `interval` s, the RSS of the ipykernel processes under this process and of the children of
    each kernel's forkserver (the ranks, each known by its rank log); keeps every process's peak."""

    def __init__(self, interval: float = POLL_SECONDS) -> None:
        import psutil

        self.psutil, self.interval = psutil, interval
        self.me = psutil.Process()
        self.peaks: dict[int, int] = {}
        self.where: dict[int, str] = {}      # pid -> the cell that ran when its peak was sampled
        self.cell, self.cell_index = "(start)", -1
        self.cell_peaks: dict[int, dict[int, int]] = {}   # pid -> cell index -> peak while that cell ran
        self.kernels: set[int] = set()
        self.children: dict[int, int | None] = {}   # forkserver child pid -> its rank (None: not known yet)
        self.described: dict[int, str] = {}          # forkserver child pid -> command line and output
        self.forkservers: set[int] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreePeaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _rss(self, proc) -> None:
        try:
            rss = proc.memory_info().rss
        except (self.psutil.NoSuchProcess, self.psutil.AccessDenied, self.psutil.ZombieProcess):
            return
        cells = self.cell_peaks.setdefault(proc.pid, {})
        if rss > cells.get(self.cell_index, 0):
            cells[self.cell_index] = rss
        if rss > self.peaks.get(proc.pid, 0):
            self.peaks[proc.pid] = rss
            self.where[proc.pid] = self.cell

    def cell_start(self, cell: Any = None, cell_index: int = 0, **_: Any) -> None:
        """papermill's on_cell_start hook: the running cell's number and first line, for `where`."""
        first = next((line.strip() for line in (cell.source if cell is not None else "").splitlines()
                      if line.strip()), "")
        self.cell, self.cell_index = f"cell {cell_index}: {first[:50]}", cell_index

    def _cmdline(self, proc) -> str:
        try:
            return " ".join(proc.cmdline())
        except (self.psutil.NoSuchProcess, self.psutil.AccessDenied, self.psutil.ZombieProcess):
            return ""

    def _children(self, proc: Any, seen: set[int], marker: str) -> list[Any]:
        """`proc`'s children whose command line names `marker` (remembered by pid once seen)."""
        try:
            children = proc.children()
        except self.psutil.NoSuchProcess:
            return []
        found = []
        for child in children:
            if child.pid not in seen:
                if marker not in self._cmdline(child):
                    continue
                seen.add(child.pid)
            found.append(child)
        return found

    def poll(self) -> None:
        for kernel in self._children(self.me, self.kernels, "ipykernel"):
            self._rss(kernel)
            for server in self._children(kernel, self.forkservers, "forkserver"):
                try:
                    children = server.children()
                except self.psutil.NoSuchProcess:
                    continue
                for child in children:
                    if self.children.get(child.pid) is None:   # a rank redirects its output after the fork
                        self.children[child.pid] = stdout_rank(child.pid)
                        if child.pid not in self.described:
                            try:
                                output = os.readlink(f"/proc/{child.pid}/fd/1")
                            except OSError:
                                output = "?"
                            self.described[child.pid] = f"{self._cmdline(child)[:120]} > {output}"
                    self._rss(child)
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def others(self) -> dict[int, str]:
        """The forkserver's children that no rank's log named: pid -> command line > output (such as the
        `ldconfig -p` the server runs as it imports torch: see the module's docstring)."""
        return {pid: self.described.get(pid, "") for pid, rank in self.children.items() if rank is None}

    def by_role(self, processes: int, kernel_until: int | None = None) -> dict[str, tuple[int, str]]:
        """{"kernel": (peak, cell), "rank 0": (peak, cell), ...}: each forkserver child under the rank its
        output names, a rank's peak the highest over the launches. The kernel's peak: over the cells before
        cell `kernel_until` (None: all)."""
        if len(self.kernels) != 1:
            raise RuntimeError(f"expected one Jupyter kernel under this process, saw {len(self.kernels)}")
        launches: dict[int, list[int]] = {}
        for pid, rank in self.children.items():
            if rank is not None:
                launches.setdefault(rank, []).append(pid)
        counts = {rank: len(pids) for rank, pids in sorted(launches.items())}
        if set(counts) != set(range(processes)) or len(set(counts.values())) != 1:
            raise RankCountError(f"ranks seen (rank: processes) {counts}, not whole launches of {processes} "
                                 f"ranks; forkserver children that are no rank: {self.others()}")
        kernel = next(iter(self.kernels))
        cells = {i: v for i, v in self.cell_peaks.get(kernel, {}).items()
                 if kernel_until is None or i < kernel_until}
        top = max(cells, key=cells.get) if cells else -1
        roles = {"kernel": (cells.get(top, 0), f"cell {top}")}
        for rank, pids in sorted(launches.items()):
            pid = max(pids, key=lambda p: self.peaks.get(p, 0))
            roles[f"rank {rank}"] = (self.peaks.get(pid, 0), self.where.get(pid, ""))
        return roles


def _rank_identity() -> tuple[int, int, int | None]:
    return int(os.environ["RANK"]), os.getpid(), stdout_rank(os.getpid())


def rank_identities(processes: int) -> list[tuple[int, int, int | None]]:
    """Launch `processes` ranks the way the notebook does (the local launcher's forkserver); each reports its
    rank, its pid and the rank its standard output's log names, which must be its own (what TreePeaks reads
    from outside): (rank, pid, rank of its log) per rank."""
    import cloudpickle

    from helpers.launch import LaunchOptions, launch

    cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the ranks need not import this file
    with temporary_environ(ENVIRONMENT):
        found = launch(_rank_identity, options=LaunchOptions(processes=processes))
    if [r for r, _, _ in found] != list(range(processes)) or any(r != logged for r, _, logged in found):
        raise RuntimeError(f"a rank's output is not its own rank's log (rank, pid, rank of its log): {found}")
    return found


# -------------------------------------------------------------------------------------------------- runs
def run_07(model_folder: Path, processes: int, work: Path, n_train: int = 8, n_test: int = 4,
           batch_size: int | None = None, gradient_checkpointing: bool = True,
           **extra: Any) -> dict[str, Any]:
    """Notebook 07 on `model_folder` under FSDP + LoRA, 1 step, with every process's peak RSS polled
    (`extra`: more notebook parameters)."""
    batch_size = batch_size or processes
    parameters = dict(model_name=str(model_folder), strategy="fsdp", peft="lora", processes=processes,
                      max_steps=1, run_parity=False, n_train=n_train, n_test=n_test, batch_size=batch_size,
                      epochs=1, output_dir=str(work / f"out-{model_folder.name}-{processes}"),
                      gradient_checkpointing=gradient_checkpointing,
                      # LoRA rank 2: on this narrow model (hidden 256) the adapters are then 1.3% of the
                      # parameters, near their 0.9% of gpt-oss-120b at the notebook's rank 16
                      lora_r=LORA_R, lora_alpha=LORA_ALPHA, **extra)
    out = work / f"07-{model_folder.name}-{processes}-{'gc' if gradient_checkpointing else 'nogc'}.ipynb"
    for attempt in (1, 2):
        start = time.perf_counter()
        with temporary_environ(ENVIRONMENT), TreePeaks() as peaks:
            nb = execute_notebook(NOTEBOOK, out, parameters, timeout=1800, on_cell_start=peaks.cell_start)
        metrics = read_metrics(nb)
        if metrics.get("processes") != processes:
            raise RuntimeError(f"the notebook ran {metrics.get('processes')} ranks, not {processes}")
        scaling = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
                        and c.source.lstrip().startswith("## Scaling up")), None)
        try:
            roles = peaks.by_role(processes, kernel_until=scaling)
            break
        except RankCountError as e:
            # a rank never polled (gone within one interval) leaves its peak unknown: measured again, once
            if attempt == 2:
                raise
            print(f"run_07 on {model_folder.name}, {processes} ranks, measured again: {e}", file=sys.stderr)
    kernel = next(iter(peaks.kernels))
    return {"peaks": {k: v[0] for k, v in roles.items()}, "peak_cells": {k: v[1] for k, v in roles.items()},
            "kernel_whole_run": peaks.peaks.get(kernel, 0),
            "kernel_whole_run_cell": peaks.where.get(kernel, ""),
            "seconds": round(time.perf_counter() - start, 1),
            "samples": peaks.samples, "precision": metrics.get("precision"),
            "other_forkserver_children": {str(pid): what for pid, what in peaks.others().items()}}


def cases(ranks: list[int], off_ranks: list[int], deep: bool = True) -> list[tuple[str, bool, int]]:
    """(shape, gradient checkpointing, ranks) of every run, in order: the benchmark's shape with checkpointing
    on at each of `ranks` and off at each of `off_ranks`, then (`deep`) the 24-layer fp32 shape both ways at
    each of `off_ranks`."""
    found = [(SHAPE, True, n) for n in ranks] + [(SHAPE, False, n) for n in off_ranks]
    if deep:
        found += [(DEEP_SHAPE, on, n) for on in (True, False) for n in off_ranks]
    return found


def measure(size_mb: float, ranks: list[int], work: Path, n_train: int = 8, n_test: int = 4,
            off_ranks: list[int] | None = None, deep: bool = True, log=print) -> dict[str, Any]:
    """Every case's runs (the tiny model's once per setting and N), and the model figures of each shape;
    the input of `table` and `verdicts`."""
    tiny = tiny_checkpoint()
    folders = {SHAPE: big_checkpoint(size_mb), **({DEEP_SHAPE: deep_checkpoint()} if deep else {})}
    figures: dict[str, Any] = {"size_mb": size_mb, "tiny_model": model_figures(tiny),
                               "tiny_checkpoint": str(tiny), "shapes": {}, "runs": []}
    for label, folder in folders.items():
        model = model_figures(folder)
        figures["shapes"][label] = {"model": model, "checkpoint": str(folder)}
        log(f"{label}: {model['parameters']:,} parameters, {model['file_bytes'] / MB:.0f} MB on disk, "
            f"{model['layers']} layers, {folder.name}")
    tiny_runs: dict[tuple[bool, int], dict[str, Any]] = {}
    checked: set[int] = set()
    for shape, on, n in cases(ranks, off_ranks if off_ranks is not None else ranks[:1], deep):
        if n not in checked:
            rank_identities(n)
            checked.add(n)
            log(f"{n} ranks: each rank's output is its own rank's log (checked with a launch of {n} ranks)")
        runs: dict[str, Any] = {}
        for label, folder in (("tiny", tiny), ("big", folders[shape])):
            if label == "tiny" and (on, n) in tiny_runs:
                runs[label] = tiny_runs[(on, n)]
                continue
            runs[label] = run_07(folder, n, work, n_train=n_train, n_test=n_test, batch_size=n * 2,
                                 gradient_checkpointing=on)
            log(f"{shape}, checkpointing {'on' if on else 'off'}, {n} ranks, {label} model: "
                f"{runs[label]['seconds']} s, {runs[label]['samples']} samples, "
                f"precision {runs[label]['precision']}")
        tiny_runs[(on, n)] = runs["tiny"]
        figures["runs"].append({"shape": shape, "gradient_checkpointing": on, "ranks": n, **runs})
    return figures


def rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per run and process: peaks in MB, the model memory, the limit it is judged against, and for
    the ranks that receive their shards the layer-sized tensors they held beyond shard and adapters
    (`in_flight`, in layers: what notebook 07 scales to gpt-oss-120b from the checkpointing-on rows)."""
    out = []
    for run in figures["runs"]:
        n, on, model = run["ranks"], run["gradient_checkpointing"], figures["shapes"][run["shape"]]["model"]
        shard = model["model_bytes"] / n
        # the adapters, made whole on every rank, and their gradients and AdamW moments, sharded
        adapters = model["adapter_parameters"] * (4 + 12 / n)
        # checkpointing off: every other layer's merged expert weights, kept by autograd for its backward
        kept = 0 if on else (model["layers"] - 1) * model["expert_bytes"]
        for role in run["tiny"]["peaks"]:
            tiny, big = run["tiny"]["peaks"][role], run["big"]["peaks"].get(role, 0)
            growth = big - tiny
            in_flight = None
            if role == "kernel":
                limit = KERNEL_SLACK_MB * MB
            elif role == "rank 0":
                limit = None                           # the loading rank: printed, not judged
            else:
                limit = (shard + model["layer_bytes"] + EXPERT_LORA_COPIES * model["expert_bytes"] + kept
                         + adapters + RANK_SLACK_MB * MB)
                in_flight = round((growth - shard - adapters) / model["layer_bytes"], 2)
            out.append({"shape": run["shape"], "gradient_checkpointing": on, "ranks": n, "process": role,
                        "peak_tiny_mb": round(tiny / MB, 1),
                        "peak_big_mb": round(big / MB, 1), "model_memory_mb": round(growth / MB, 1),
                        "model_mb": round(model["model_bytes"] / MB, 1), "shard_mb": round(shard / MB, 1),
                        "layer_mb": round(model["layer_bytes"] / MB, 1), "layers": model["layers"],
                        "expert_mb": round(model["expert_bytes"] / MB, 1),
                        "kept_experts_mb": None if role == "kernel" else round(kept / MB, 1),
                        "adapters_mb": None if role == "kernel" else round(adapters / MB, 1),
                        "in_flight_layers": in_flight,
                        "limit_mb": None if limit is None else round(limit / MB, 1),
                        "ok": None if limit is None else growth <= limit})
    return out


def recommended(rows_: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the configuration notebook 07 recommends for real sizes (gradient checkpointing on): the
    ones its figures are drawn from."""
    return [r for r in rows_ if r.get("gradient_checkpointing", True)]


def table(figures: dict[str, Any]) -> str:
    head = ("shape", "checkpointing", "ranks", "process", "peak tiny MB", "peak big MB", "model memory MB",
            "x model", "model MB", "shard MB", "layer MB", "adapters MB", "in flight (layers)", "limit MB",
            "verdict")
    lines = [head]
    for r in rows(figures):
        verdict = "loads the checkpoint" if r["ok"] is None else ("ok" if r["ok"] else "ABOVE LIMIT")
        lines.append((r["shape"], "on" if r["gradient_checkpointing"] else "off", str(r["ranks"]),
                      r["process"],
                      f"{r['peak_tiny_mb']:.0f}", f"{r['peak_big_mb']:.0f}",
                      f"{r['model_memory_mb']:+.0f}", f"{r['model_memory_mb'] / r['model_mb']:+.2f}",
                      f"{r['model_mb']:.0f}", f"{r['shard_mb']:.0f}",
                      f"{r['layer_mb']:.0f}", "-" if r["adapters_mb"] is None else f"{r['adapters_mb']:.0f}",
                      "-" if r["in_flight_layers"] is None else f"{r['in_flight_layers']:.1f}",
                      "-" if r["limit_mb"] is None else f"{r['limit_mb']:.0f}",
                      verdict))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) if i not in (0, 1, 3, len(head) - 1) else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip()
                     for line in lines)


def verdicts(figures: dict[str, Any]) -> list[str]:
    """The failed verdicts, one sentence each (empty: every process within its limit)."""
    failed = []
    for r in rows(figures):
        if r["ok"] is False:
            kept = (f" + every other layer's merged experts ({r['layers'] - 1} x {r['expert_mb']:.0f} MB)"
                    if r["kept_experts_mb"] else "")
            what = ("the kernel's peak grew with the model" if r["process"] == "kernel" else
                    f"{r['process']} held more than its shard ({r['shard_mb']:.0f} MB) + one gathered layer "
                    f"({r['layer_mb']:.0f} MB) + PEFT's expert LoRA ({EXPERT_LORA_COPIES} x "
                    f"{r['expert_mb']:.0f} MB){kept} + the adapters + slack")
            failed.append(f"{r['shape']}, checkpointing {'on' if r['gradient_checkpointing'] else 'off'}, "
                          f"{r['ranks']} ranks: {what}: model memory {r['model_memory_mb']:+.0f} MB > limit "
                          f"{r['limit_mb']:.0f} MB (model {r['model_mb']:.0f} MB at the training precision)")
    return failed


def loading_rank_lines(figures: dict[str, Any]) -> list[str]:
    out = []
    for r in rows(figures):
        if r["process"] == "rank 0":
            out.append(f"{r['shape']}, checkpointing {'on' if r['gradient_checkpointing'] else 'off'}, "
                       f"{r['ranks']} ranks: rank 0 (reads the checkpoint) model memory "
                       f"{r['model_memory_mb']:+.0f} MB = {r['model_memory_mb'] / r['model_mb']:.2f} x the "
                       f"model "
                       f"(expected about one model + its shard: {r['model_mb'] + r['shard_mb']:.0f} MB)")
    return out


def peak_cell_lines(figures: dict[str, Any]) -> list[str]:
    """Where each process peaked: the cell that ran when its highest sample was taken."""
    out = []
    for case in figures["runs"]:
        name = (f"{case['shape']}, checkpointing {'on' if case['gradient_checkpointing'] else 'off'}, "
                f"{case['ranks']} ranks")
        for label in ("tiny", "big"):
            run = case[label]
            for role, cell in run.get("peak_cells", {}).items():
                out.append(f"{name}, {label} model, {role} peaked in {cell}")
            out.append(f"{name}, {label} model, kernel over the whole notebook (Scaling up included): "
                       f"{run['kernel_whole_run'] / MB:.0f} MB, in {run['kernel_whole_run_cell']}")
    return out


def report(figures: dict[str, Any], log=print) -> list[str]:
    log(table(figures))
    for line in [*loading_rank_lines(figures), *peak_cell_lines(figures)]:
        log(line)
    for why in SLACK_WHY.values():
        log(why)
    failed = verdicts(figures)
    for line in failed:
        log(f"FAIL: {line}")
    if not failed:
        log(f"every rank but the loading one held at most its shard + one gathered layer + "
            f"{EXPERT_LORA_COPIES} x its expert weights (PEFT's expert LoRA) + the adapters + slack with "
            "gradient checkpointing on, and that + every other layer's merged expert weights with it off; "
            "the kernel's peak did not grow with the model")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=1500,
                        help="the big checkpoint's size in bf16 (MB of 10**6 bytes)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4],
                        help="numbers of ranks with gradient checkpointing on, in order")
    parser.add_argument("--off-ranks", type=int, nargs="*", default=[2],
                        help="numbers of ranks with gradient checkpointing off, and for the 24-layer shape")
    parser.add_argument("--no-deep", action="store_true",
                        help="leave out the 24-layer fp32 checkpoint (gpt-oss-20b's depth, 1.63 GB)")
    parser.add_argument("--n-train", type=int, default=8, help="training conversations (1 step is run)")
    parser.add_argument("--n-test", type=int, default=4, help="held-out conversations")
    parser.add_argument("--json", type=Path, default=None, help="write the figures (and verdicts) here")
    parser.add_argument("--rejudge", type=Path, default=None,
                        help="a JSON this benchmark wrote: recompute its rows and verdicts with this file's "
                             "limits from the peaks it stored, rewrite it, measure nothing")
    args = parser.parse_args(argv)
    if args.rejudge:
        try:
            figures = json.loads(args.rejudge.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"--rejudge {args.rejudge}: cannot read it as JSON ({e}); pass a file that "
                             "--json wrote") from None
        if not isinstance(figures, dict) or not isinstance(figures.get("runs"), list) \
                or "shapes" not in figures:
            raise SystemExit(f"--rejudge {args.rejudge}: not a file written by this version's --json (no "
                             "list of 'runs' or no 'shapes'); run the benchmark again")
        args.json = args.rejudge
    else:
        with tempfile.TemporaryDirectory(prefix="llm-memory-") as work:
            figures = measure(args.size_mb, args.ranks, Path(work), n_train=args.n_train, n_test=args.n_test,
                              off_ranks=args.off_ranks, deep=not args.no_deep)
    failed = report(figures)
    if args.json:
        figures["rows"] = rows(figures)
        figures["failed"] = failed
        figures["slack_mb"] = {"kernel": KERNEL_SLACK_MB, "rank": RANK_SLACK_MB}
        args.json.write_text(json.dumps(figures, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
