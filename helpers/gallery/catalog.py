"""Every notebook of the gallery, one record each: what the rest of the project knows about it.

The scale-up runner and its table (`helpers.gallery.scale_up`, `scale_up_table`), the GPU check
(`tools/gpu_check`), the reference check (`helpers.reference`), the lesson-shape budgets
(`helpers.gallery.lesson_shape`) and the tests read these records; none keeps its own list. Adding a notebook
takes the notebook, its reference file (notebooks/references/<stem>.json, for one that trains), its test file
(tests/test_nbNN_*.py) and one record here: `tests/test_catalog.py` fails until all four agree.

Standard library only (helpers.paths too): the GPU check reads it on a machine with other packages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.paths import NOTEBOOKS_DIR

REFERENCES_DIR = NOTEBOOKS_DIR / "references"

# What every notebook's kernel imports, and MLflow, which every notebook saves its trained model with and
# loads it back from (mlflow-skinny): the GPU check carries these to a machine that lacks them.
NOTEBOOK_KERNEL = ("papermill", "nbclient", "nbformat", "ipykernel", "IPython", "zmq")
NOTEBOOK_BASE = (*NOTEBOOK_KERNEL, "mlflow")


@dataclass(frozen=True)
class ScaleUp:
    """The notebook's full-size run: the one parameter set its "Scaling up" section prints."""

    where: str                    # the machine the command is meant for: the README's link text
    parameters: dict[str, Any]    # papermill parameters, in the order they are printed


@dataclass(frozen=True)
class GpuCheck:
    """How the GPU check runs the notebook: its few-step parameters, its time limit, what it records."""

    limit_s: int  # wall clock for the whole notebook on one H200 (scaled by --time-scale)
    throughput: str  # the metric that holds its throughput
    parameters: dict[str, Any] = field(default_factory=dict)  # papermill parameters (processes is added)
    cpu_parameters: dict[str, Any] = field(default_factory=dict)  # overrides for --device cpu
    carried: tuple[str, ...] = NOTEBOOK_BASE  # modules the bundle brings: missing is a failure
    uncarried: tuple[str, ...] = ()  # modules that cannot be carried: missing means skipped
    uncarried_reason: str = ""
    note_one_process: str = ""  # what runs elsewhere (or not at all) when the notebook gets one GPU


@dataclass(frozen=True)
class PlannedModel:
    """The published model a scale-up command names, as `helpers.memory_plan` plans it."""

    model: str      # memory_plan's name, e.g. "gpt-oss-120b"
    training: str   # "full", "lora" or "qlora"
    technique: str  # "ddp", "fsdp", "zero3"


@dataclass(frozen=True)
class Notebook:
    """One notebook: its stem and every fact another part of the project needs about it."""

    stem: str                               # "04_fsdp_transformer"
    trains: bool = True                     # takes `precision`, has a reference and a GPU check
    budget: int | None = None               # code lines a reader studies before its Checks (lesson_shape)
    anchors: tuple[str, ...] = ()           # the framework's constructs it shows before its Checks
    scale_up: ScaleUp | None = None
    gpu_check: GpuCheck | None = None
    planned: PlannedModel | None = None     # the published model its scale-up trains, where it names one

    @property
    def number(self) -> str:
        return self.stem[:2]

    @property
    def path(self) -> Path:
        return NOTEBOOKS_DIR / f"{self.stem}.ipynb"

    @property
    def reference(self) -> Path | None:
        """Its reference runs (helpers.reference), for a notebook that trains."""
        return REFERENCES_DIR / f"{self.stem}.json" if self.trains else None


# A GPU check's limit is about 1.3x the notebook's time on an H200 (docs/gpu-check.md); those of the notebooks
# that run there add up to 540 s (plus ~20 s to install the bundle and start): every notebook fits the default
# budget. A notebook may also use what the ones before it left unused, never what the ones after it need.
CATALOG: tuple[Notebook, ...] = (
    Notebook("00_getting_started", trains=False),
    Notebook(
        "01_ddp_mlp", budget=100, anchors=("DistributedDataParallel",),
        scale_up=ScaleUp("on 8 GPUs", {"batch_size": 512, "lr": 0.4, "epochs": 30}),
        gpu_check=GpuCheck(
            40, "samples_per_s", parameters={"epochs": 2, "max_steps": 40, "parity_steps": 5},
            note_one_process="parity proof (1 vs 2 processes) ran on 2 CPU processes (gloo, fp32): 2 "
                             "ranks may not share one GPU")),
    Notebook(
        "02_ddp_retinanet", budget=170, anchors=("retinanet",),
        scale_up=ScaleUp("on 8 GPUs, COCO 2017", {
            "backbone": "resnet50_fpn_v2", "fpn_channels": 256, "anchor_size": 32,
            "anchor_ratios": [0.5, 1.0, 2.0], "image_size": 800, "batch_size": 64, "lr": 0.0005, "epochs": 26,
            "warmup_steps": 1000, "data_path": "/data/coco", "weights_path": "/models/resnet50-11ad3fa6.pth",
            "num_workers": 8}),
        gpu_check=GpuCheck(
            # enough steps, without the 30-step warm-up, that a trained epoch beats the untrained model: the
            # notebook asserts the best checkpoint is the best of *all* epochs, the untrained epoch 0 included
            75, "images_per_s",
            parameters={"epochs": 2, "max_steps": 40, "warmup_steps": 2, "parity_steps": 2},
            carried=(*NOTEBOOK_BASE, "pycocotools", "torchmetrics"),
            note_one_process="parity proof (1 vs 2 processes) ran on CPU, as the notebook always does; "
                             "SyncBatchNorm over 1 rank")),
    Notebook(
        "03_lightning_two_tower_mds", budget=150, anchors=("Trainer(",),
        scale_up=ScaleUp("on 8 GPUs, MovieLens 25M", {
            "data_path": "/data/ml-25m", "batch_size": 8192, "embed_dim": 128, "lr": 0.002, "epochs": 5,
            "shard_size": "64mb", "eval_users": 10000, "tracking_uri": "http://mlflow.example:5000",
            "run_parity": False}),
        gpu_check=GpuCheck(
            75, "samples_per_s",
            parameters={"epochs": 2, "max_steps": 8, "eval_users": 500, "parity_steps": 2},
            carried=(*NOTEBOOK_BASE, "lightning", "streaming", "zstd"),
            note_one_process="parity proof (2 DDP ranks vs 1 accumulating process) ran on CPU, as the "
                             "notebook always does; Lightning DDP over 1 GPU rank")),
    Notebook(
        "04_fsdp_transformer", budget=150, anchors=("fully_shard",),
        scale_up=ScaleUp("on 8 GPUs", {
            "preset": "10M", "steps": 5000, "batch_size": 256, "lr": 0.001, "checkpoint_every": 500,
            "fail_at_step": None, "output_dir": "/shared/ckpt/run1"}),
        gpu_check=GpuCheck(
            90, "tokens_per_s",
            parameters={"preset": "10M", "max_steps": 10, "checkpoint_every": 4, "fail_at_step": 6,
                        "parity_steps": 3, "eval_batches": 2},
            cpu_parameters={"preset": "tiny"},
            note_one_process="FSDP-vs-DDP parity and the sharding measurement ran on 2 CPU processes (2 "
                             "ranks may not share one GPU); the GPU run is FSDP over 1 rank (nothing "
                             "sharded); crash-and-resume demo on the GPU")),
    Notebook(
        "05_deepspeed_zero_sft", budget=130, anchors=("SFTTrainer", "zero_optimization"),
        scale_up=ScaleUp("on 8 GPUs, Llama 3.2 1B", {
            "model_name": "/models/Llama-3.2-1B-Instruct", "data_path": "my_chats.jsonl", "zero_stage": 3,
            "batch_size": 64, "lr": 2e-5, "epochs": 2, "max_length": 1024, "output_dir": "/models/llama-sft",
            "run_parity": False}),
        gpu_check=GpuCheck(
            55, "samples_per_s",
            parameters={"n_train": 320, "n_test": 32, "max_steps": 5, "parity_steps": 2},
            carried=(*NOTEBOOK_BASE, "deepspeed", "trl", "datasets", "pydantic", "hjson"),
            note_one_process="ZeRO stage parity ran on the GPU with 1 rank; the sharding assertions (stages "
                             "1 and 3 hold less per rank) need 2+ ranks and were skipped"),
        planned=PlannedModel("llama-3.2-1b", "full", "zero3")),
    Notebook(
        "06_ray_train_resnet", budget=130, anchors=("TorchTrainer",),
        scale_up=ScaleUp("on a Ray cluster with 8 GPUs", {
            "cluster": "auto", "processes": 8, "data_path": "/shared/data", "n_train": 55000,
            "n_val": 5000, "n_test": 10000, "epochs": 20, "batch_size": 512, "lr": 0.2,
            "fail_at_epoch": None, "output_dir": "/shared/ray-results", "tracking_uri": "http://mlflow.example:5000"}),
        gpu_check=GpuCheck(
            90, "images_per_s",
            parameters={"epochs": 1, "max_steps": 4, "n_train": 256, "n_val": 64, "n_test": 64,
                        "fail_at_epoch": None},
            uncarried=("ray",),
            uncarried_reason="needs Ray Train, which the GPU machine lacks; Ray's wheel alone "
                             "(79 MB for 2.60.0 cp312) is more than the default transfer "
                             "(gpu_bundle.py --transfer-mib 64)",
            note_one_process="one Ray Train worker on the GPU")),
    Notebook(
        "07_trl_sft_gpt_oss", budget=140, anchors=("SFTConfig",),
        scale_up=ScaleUp("on 8 GPUs, gpt-oss-120b", {
            "model_name": "openai/gpt-oss-120b", "strategy": "fsdp", "peft": "lora",
            "data_path": "my_chats.jsonl",
            "batch_size": 32, "lr": 0.0002, "epochs": 1, "max_length": 2048, "gradient_checkpointing": True,
            "run_parity": False, "output_dir": "/models/gpt-oss-120b-lora"}),
        gpu_check=GpuCheck(
            65, "samples_per_s",
            parameters={"n_train": 320, "n_test": 16, "max_steps": 5, "run_parity": False},
            carried=(*NOTEBOOK_BASE, "trl", "datasets"),
            note_one_process="DDP-vs-FSDP parity and the per-rank memory comparison need 2 ranks and were "
                             "skipped; FSDP over 1 GPU rank (nothing sharded)"),
        planned=PlannedModel("gpt-oss-120b", "lora", "fsdp")),
    # Its GPU-only parts, asserted by the notebook itself on a GPU: Unsloth's kernels in the model's attention
    # and MLP (its "from Unsloth" column), and the plain TRL + PEFT launch it is timed against
    # (compare_plain="auto" turns it on there), whose ratio the report shows as unsloth_speedup_vs_plain.
    # Skipped where Unsloth cannot be imported: its wheel alone is 28 MB, too much beside the other notebooks'
    # wheels in the default transfer, so it is not in gpu-bundle/.
    Notebook(
        "08_unsloth_llama", budget=120, anchors=("FastLanguageModel",),
        scale_up=ScaleUp("on 8 GPUs, Llama 3.2 3B in 4 bits", {
            "model_name": "unsloth/Llama-3.2-3B-Instruct", "data_path": "my_chats.jsonl", "batch_size": 16,
            "lr": 0.0002, "epochs": 1, "max_length": 2048, "output_dir": "/models/llama-3.2-3b-lora"}),
        gpu_check=GpuCheck(
            90, "samples_per_s",
            parameters={"n_train": 320, "n_test": 16, "max_steps": 8, "compare_steps": 5},
            carried=(*NOTEBOOK_BASE, "trl", "datasets"),
            uncarried=("unsloth", "unsloth_zoo"),
            uncarried_reason="needs Unsloth, which the GPU machine lacks; its wheel (28 MB for 2026.10.9) "
                             "does not fit the default transfer (64 MiB) beside the other notebooks' wheels: "
                             "run `--only 08` with unsloth and unsloth_zoo wheels carried",
            note_one_process="DDP over 1 GPU rank (nothing to all-reduce); the same steps timed with plain "
                             "TRL + PEFT in fresh processes"),
        planned=PlannedModel("llama-3.2-3b", "qlora", "ddp")),
    # Its GPU parts, asserted by the notebook itself on a GPU: QLoRA on bitsandbytes' CUDA 4-bit kernels
    # (Axolotl's `adapter: qlora`; the notebook checks the trained model was 4-bit; its CPU kernels run in
    # the scale-up test) and Axolotl's `bf16: auto`. The ranks run the check's own python
    # (axolotl_python="python3"), and the check is skipped where that python cannot import Axolotl: it
    # needs its own environment (envs/axolotl, 243 packages), far more than a transfer of wheels.
    Notebook(
        "09_axolotl_olmo3", budget=120, anchors=("adapter:", "lora_r:"),
        scale_up=ScaleUp("on 8 GPUs, OLMo 3 7B with QLoRA", {
            "model_name": "allenai/Olmo-3-7B-Instruct", "data_path": "my_chats.jsonl", "batch_size": 16,
            "lr": 0.0002, "epochs": 1, "max_length": 2048, "gradient_checkpointing": True,
            "output_dir": "/models/olmo-3-7b-qlora"}),
        gpu_check=GpuCheck(
            60, "samples_per_s",
            parameters={"n_train": 320, "n_test": 16, "max_steps": 8, "load_in_4bit": True,
                        "axolotl_python": "python3"},
            uncarried=("axolotl",),
            uncarried_reason="needs Axolotl 0.13.2 in the python given as axolotl_python; its environment "
                             "(envs/axolotl/requirements.lock) is far more than a transfer of wheels carries",
            note_one_process="DDP over 1 GPU rank (nothing to all-reduce); QLoRA on the tiny OLMo 3"),
        planned=PlannedModel("olmo-3-7b", "qlora", "ddp")),
    # Its GPU-only parts: fp16 autocast with a GradScaler, torch.compile generating Triton kernels, the
    # profiler recording CUDA activity. The slowest there: the compile and the elastic section's CPU runs.
    Notebook(
        "10_fast_and_elastic", budget=170, anchors=("no_sync", "torch.compile", "autocast"),
        scale_up=ScaleUp("on 8 GPUs", {
            "preset": "10M", "steps": 200, "batch_size": 256, "micro_batches": 8, "lr": 0.02,
            "straggler_ms": 0, "resume_world_sizes": [1, 4], "output_dir": "/shared/nb10"}),
        gpu_check=GpuCheck(
            140, "tokens_per_s",
            parameters={"steps": 8, "profile_steps": 2, "straggler_ms": 0, "resume_world_sizes": [1, 2]},
            note_one_process="DDP over 1 GPU rank (the all-reduces are counted but move nothing); the "
                             "elastic save-on-2, resume-on-1-and-2 section ran on CPU processes")),
)

BY_STEM: dict[str, Notebook] = {nb.stem: nb for nb in CATALOG}


def training() -> list[Notebook]:
    """The notebooks that train a model, in name order."""
    return [nb for nb in CATALOG if nb.trains]


def by_number(number: str) -> Notebook:
    """The record of notebook "04" (or of a stem that starts with it)."""
    for nb in CATALOG:
        if nb.stem.startswith(number[:2]):
            return nb
    raise KeyError(f"no notebook {number!r} in helpers/gallery/catalog.py: one of "
                   f"{', '.join(nb.number for nb in CATALOG)}")


def problems(notebooks_dir: Path = NOTEBOOKS_DIR, tests_dir: Path | None = None,
             catalog: tuple[Notebook, ...] = CATALOG) -> list[str]:
    """Where the catalog and the files disagree, one line each, naming what to add or remove.

    A notebook without a record is invisible to the scale-up runner, the GPU check and the reference check; a
    record without its notebook makes them fail later, far from the cause.
    """
    tests_dir = tests_dir or notebooks_dir.parent / "tests"
    found = []
    on_disk = {p.stem for p in notebooks_dir.glob("[0-9][0-9]_*.ipynb")}
    records = {nb.stem for nb in catalog}
    for stem in sorted(on_disk - records):
        found.append(f"notebooks/{stem}.ipynb has no record in helpers/gallery/catalog.py: "
                     f"add Notebook({stem!r}, ...)")
    for stem in sorted(records - on_disk):
        found.append(f"helpers/gallery/catalog.py has a record for {stem} but notebooks/{stem}.ipynb "
                     "does not exist")
    references = {p.stem for p in (notebooks_dir / "references").glob("*.json")}
    for nb in catalog:
        if not list(tests_dir.glob(f"test_nb{nb.number}_*.py")):
            found.append(f"{nb.stem} has no test file: add tests/test_nb{nb.number}_<name>.py")
        if nb.trains and nb.stem not in references:
            found.append(f"{nb.stem} trains but has no notebooks/references/{nb.stem}.json: "
                         f"python benchmarks/reference_spread.py {nb.number} "
                         "--fit native,avx2,seed3,seed4,seed5 --write")
        if nb.trains and not (nb.scale_up and nb.gpu_check and nb.budget and nb.anchors):
            found.append(f"{nb.stem} trains: its record needs scale_up, gpu_check, budget and anchors")
    for stem in sorted(references - {nb.stem for nb in catalog if nb.trains}):
        found.append(f"notebooks/references/{stem}.json belongs to no training notebook of the catalog")
    return found
