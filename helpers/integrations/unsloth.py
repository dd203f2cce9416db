"""Unsloth (notebook 08): what the kernel sets before Unsloth is imported, which of Unsloth's speed-ups a
trained model actually runs, and the plain TRL + PEFT run Unsloth is timed against.

Why a module: the lesson is Unsloth's recipe (`FastLanguageModel.from_pretrained`, `get_peft_model`,
`SFTTrainer`, `for_inference`). Around it the notebook proves three things no recipe shows: which functions
ran each part of the model (on a GPU Unsloth replaces them with its kernels; on a CPU it keeps
transformers' code, and the notebook says so rather than report a speed-up that did not happen), how fast
Unsloth is against the same steps without it, and that the ranks trained what the plan counted. That
machinery lives here, called by one line each.

Nothing here imports Unsloth, transformers, TRL or PEFT at module level: Unsloth must be imported before
them (it patches them as it is imported), and the plain run's ranks must never import it at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

# what train_embeddings adds to the targets, trained in full (a tuple: peft extends the lists it is given)
EMBEDDINGS = ("embed_tokens", "lm_head")
UNSLOTH_MODULES = ("unsloth.", "unsloth_zoo.")
WARM_UP_STEPS = 2   # the first steps of a timed run (kernel compilation, allocator growth) are not timed


# ---- the kernel, before `import unsloth` ---------------------------------------------------------------

def before_unsloth(preload: Sequence[str] = ("unsloth", "trl.trainer.sft_trainer", "datasets")) -> None:
    """Call in the notebook's kernel before `import unsloth`: what it sets, the ranks inherit.

    transformers, huggingface_hub and datasets are told through their environment variables to keep their
    notices and progress bars to themselves (the launcher draws rank 0's steps, the notebook prints what the
    run did): they must not be imported before Unsloth to be told otherwise. The ranks fork after the kernel
    tokenized, so tokenizers must not have started their thread pools. transformers imports DeepSpeed's
    accelerator probe, which on a machine without GPUs must be told it is a CPU. tqdm's notice that ipywidgets
    is missing says nothing the reader can act on. Last, the launcher's forkserver starts with `preload`
    imported (Unsloth, and with it the transformers, TRL and PEFT it patches: 10-15 s a process), on another
    core while the notebook goes on; every rank forks from it (see `helpers.launch.preload`).
    """
    import torch

    # importing the launcher also drops two import-time notices of PEFT's dependencies
    from helpers.launch import preload as start_forkserver

    for name, value in (("TRANSFORMERS_VERBOSITY", "error"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                        ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(name, value)
    if not torch.cuda.device_count():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    warnings.filterwarnings("ignore", message="IProgress not found")
    start_forkserver(*preload)


# ---- the LoRA plan, in the kernel ----------------------------------------------------------------------

def plan_lora(config: Any, r: int, alpha: float, targets: Sequence[str], *, embeddings: bool,
              four_bit: bool) -> Any:
    """The trainable parameters the ranks' `FastLanguageModel.get_peft_model` must end with, counted by peft
    on the `meta` device (nothing allocated), after checking that every target names a module of the model;
    printed, and returned as `helpers.memory_plan.ParamCounts`.

    A target that matches nothing would otherwise fail inside the ranks, after the launch, or (a typo among
    several) train fewer adapters than asked without a word. Unsloth turns `embed_tokens` and `lm_head`
    among its targets into PEFT's `modules_to_save` (trained in full, kept tied): the plan does the same.
    """
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from helpers.memory_plan import count_parameters

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    leaves = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    asked = list(targets) + (list(EMBEDDINGS) if embeddings else [])
    missing = [t for t in asked if t not in leaves]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                         if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"lora_target_modules: {missing} match no module of this model; its linear layers "
                         f"are {linear}.")
    lora = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), task_type="CAUSAL_LM",
                      modules_to_save=list(EMBEDDINGS) if embeddings else None,
                      ensure_weight_tying=embeddings)
    planned = count_parameters(config, lora=lora, load_in_4bit=bool(four_bit), name="this model")
    print(f"LoRA r={r} on {list(targets)}{' + embed_tokens, lm_head in full' if embeddings else ''}: "
          f"{planned.trainable:,} trainable parameters of {planned.total:,} "
          f"({planned.trainable / planned.total:.1%})")
    return planned


# ---- in a rank ------------------------------------------------------------------------------------------

def plain_peft_model(cfg: Mapping[str, Any], dtype: Any, device: str) -> tuple[Any, Any]:
    """The model Unsloth is timed against: the same checkpoint and adapters with transformers + PEFT alone
    (bitsandbytes' NF4 for 4 bits, as QLoRA does it without Unsloth), in a rank that never imported Unsloth.

    `cfg` holds the notebook's settings: model_path, four_bit, gradient_checkpointing, lora_r, lora_alpha,
    lora_target_modules, embeddings, seed.
    """
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=dtype) if cfg["four_bit"] else None
    model = AutoModelForCausalLM.from_pretrained(cfg["model_path"], dtype=dtype,
                                                 quantization_config=quantization,
                                                 device_map={"": device} if cfg["four_bit"] else None)
    tokenizer = AutoTokenizer.from_pretrained(cfg["model_path"])
    if tokenizer.pad_token is None:   # Llama 3 tokenizers ship without one
        tokenizer.pad_token = tokenizer.eos_token
    checkpointing = bool(cfg["gradient_checkpointing"])   # "unsloth" (offloaded) has no plain equivalent
    if cfg["four_bit"]:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=checkpointing)
    elif checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    torch.manual_seed(cfg["seed"])
    full = list(EMBEDDINGS) if cfg["embeddings"] else None
    lora = LoraConfig(r=cfg["lora_r"], lora_alpha=cfg["lora_alpha"], lora_dropout=0.0,
                      target_modules=list(cfg["lora_target_modules"]), modules_to_save=full,
                      ensure_weight_tying=bool(full), task_type="CAUSAL_LM")
    return get_peft_model(model, lora), tokenizer


def _origin(fn: Any) -> str:
    """Where a function's code lives, as a dotted name: a decorator that copies the wrapped function's name
    (functools.wraps) cannot hide it, since the code object keeps the file it was compiled from."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    parts = Path(code.co_filename).with_suffix("").parts
    top = next((i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")), None)
    module = ".".join(parts[top + 1:]) if top is not None else parts[-1]
    return f"{module}.{code.co_qualname.replace('<locals>.', '')}"


def implementations(model: Any) -> dict[str, list[str]]:
    """Which functions run each part of a (PEFT) Llama-type model, outermost first, down through
    `__wrapped__` to the model's own code: Unsloth's where it patched them (on GPUs), else transformers'.
    Also the kernel of TRL's fused LM head, through which `SFTTrainer` computes the loss."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layer = base.model.layers[0]
    parts = {"decoder layer": layer, "attention": layer.self_attn, "MLP": layer.mlp,
             "RMSNorm": layer.input_layernorm, "rotary embedding": base.model.rotary_emb,
             "LM head and loss": base}
    found = {}
    for part, module in parts.items():
        fn, chain = getattr(module.forward, "__func__", module.forward), []
        while fn is not None and len(chain) < 6:
            chain.append(_origin(fn))
            fn = getattr(fn, "__wrapped__", None)
        found[part] = chain
    from trl.trainer import utils as trl_utils

    kernel = getattr(trl_utils, "_ChunkedLogProbFunction", None)   # Triton on GPUs; Unsloth's CPU ops here
    if kernel is not None:
        found["loss kernel (TRL's fused LM head)"] = [
            f"{kernel.__module__}.{kernel.__qualname__.replace('<locals>.', '')}"]
    return found


@contextlib.contextmanager
def measured(trainer: Any, ctx: Any, label: str) -> Iterator[dict[str, Any]]:
    """Around `trainer.train()` in a rank (`ctx`: its `worker_context()`): rank 0's progress bar in the
    notebook, and, in the dict it yields (filled once training is done), what the rank returns about the run:
    the loss (`trainer.step_losses`, see `with_step_losses`) and wall time of every step, the wrapper the
    trainer put round the model (DDP), which functions ran each part of it (`implementations`), a
    fingerprint of the trained weights (under DDP every rank must end with the same adapters, bit for bit),
    the trainable count (the trainer's and peft's own), whether the base was 4-bit, the peak GPU memory.
    `label` names the run in the bar and in rank 0's closing line."""
    import torch
    from transformers import PrinterCallback, TrainerCallback

    from helpers.integrations.transformers import transformers_progress_callback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.ends.append(time.perf_counter() - start)

    clock = StepClock()
    trainer.add_callback(transformers_progress_callback(label))
    trainer.add_callback(clock)
    trainer.remove_callback(PrinterCallback)   # with disable_tqdm it prints every log line: the bar has them
    cuda = ctx.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    record: dict[str, Any] = {}
    start = time.perf_counter()
    yield record
    seconds = time.perf_counter() - start
    model = trainer.model
    fingerprint = hashlib.sha256()
    for name, p in model.named_parameters():
        if p.requires_grad:
            fingerprint.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
    record.update({
        "step_losses": list(trainer.step_losses), "step_ends": list(clock.ends), "train_seconds": seconds,
        "wrapper": type(trainer.model_wrapped).__name__, "implementations": implementations(model),
        "fingerprint": fingerprint.hexdigest(),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "peft_trainable": model.get_nb_trainable_parameters()[0],   # what print_trainable_parameters says
        "four_bit": bool(getattr(model.get_base_model(), "is_loaded_in_4bit", False)),
        "cuda_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None})
    if ctx.is_main:
        last = f", last loss {trainer.step_losses[-1]:.4f}" if trainer.step_losses else ""
        print(f"{label}: {len(trainer.step_losses)} steps in {seconds:.1f} s{last}")


# ---- in the kernel, after the launch ---------------------------------------------------------------------

def epoch_means(losses: Any, epochs: int) -> list[dict[str, Any]]:
    """The mean loss of each epoch from the loss of every step (a pandas Series, in step order), as
    `[{"epoch": 1, "train_loss": ...}, ...]`: the history a run records. A run capped by `max_steps` may stop
    inside an epoch, so the steps are split evenly into at most `epochs` parts."""
    per_epoch = max(1, len(losses) // epochs)
    return [{"epoch": e + 1, "train_loss": float(losses.iloc[e * per_epoch:(e + 1) * per_epoch].mean())}
            for e in range(min(epochs, len(losses)))]


def show_speedups(found: Mapping[str, Sequence[str]]) -> Any:
    """Print `implementations` as a table, and return it: the outermost function of each part, the model's own
    code under it, and whether Unsloth's code is anywhere in between."""
    import pandas as pd

    table = pd.DataFrame({"outermost function": {k: v[0] for k, v in found.items()},
                          "the model's own code": {k: v[-1] for k, v in found.items()}})
    table["from Unsloth"] = [any(f.startswith(UNSLOTH_MODULES) for f in chain) for chain in found.values()]
    print(table.to_string())
    return table


def time_against_plain(fine_tune: Any, cfg: Mapping[str, Any], steps: int, cluster: str | None,
                       **kwargs: Any) -> dict[str, list[dict[str, Any]]]:
    """Launch `fine_tune` (the notebook's distributed function) for `steps` steps with plain TRL + PEFT, then
    with Unsloth, one after the other on the same ranks' resources, without evaluating or saving
    (`output_dir=None`); {"plain": results, "unsloth": results}.

    Unsloth patches transformers as it is imported, so the plain run's ranks start fresh (spawn) instead of
    forking from the launcher's forkserver, which imported Unsloth; on a Ray cluster every launch's workers
    are fresh processes anyway (start_method is for launches on this machine).
    """
    timed = {}
    for backend in ("plain", "unsloth"):
        fresh = {} if cluster is not None or backend == "unsloth" else {"start_method": "spawn"}
        timed[backend] = fine_tune.options(**fresh).distributed(dict(cfg, output_dir=None), steps, backend,
                                                                 **kwargs)
    return timed


def steady_rate(run: Mapping[str, Any], batch_size: int) -> float:
    """Samples per second over a run's steps after the warm-up ones."""
    ends = run["step_ends"]
    if len(ends) <= WARM_UP_STEPS:
        raise ValueError(f"a timed run needs more than {WARM_UP_STEPS} steps (the first are warm-up); it has "
                         f"{len(ends)}")
    return (len(ends) - WARM_UP_STEPS) * batch_size / (ends[-1] - ends[WARM_UP_STEPS - 1])


def comparison_table(timed: Mapping[str, Sequence[Mapping[str, Any]]], batch_size: int) -> tuple[Any, float]:
    """The timed runs side by side (samples per second, the first step losses as the ranks' mean, rank 0's
    peak GPU memory), and Unsloth's speed-up: its samples per second over plain TRL + PEFT's."""
    import pandas as pd

    rows = {}
    for backend, runs in timed.items():
        first = pd.DataFrame([r["step_losses"] for r in runs]).mean()[:3]
        rows[backend] = {"samples / s": steady_rate(runs[0], batch_size),
                         "step losses (first 3)": [round(float(x), 4) for x in first],
                         "peak GPU MiB (rank 0)": runs[0]["cuda_peak_mb"]}
    table = pd.DataFrame(rows).T
    return table, float(table.loc["unsloth", "samples / s"] / table.loc["plain", "samples / s"])


def show_comparison(timed: Mapping[str, Sequence[Mapping[str, Any]]], batch_size: int) -> float | None:
    """Show `comparison_table` and Unsloth's speed-up, which it returns; with no timed runs (compare_plain
    off), say so and return None."""
    if not timed:
        print("compare_plain is off here (on a CPU Unsloth runs transformers' own code: there is no speed-up "
              "to measure)")
        return None
    from IPython.display import display

    table, speedup = comparison_table(timed, batch_size)
    display(table)
    steps = len(next(iter(timed.values()))[0]["step_ends"])
    print(f"Unsloth ran {speedup:.2f}x the samples per second of plain TRL + PEFT, over {steps} steps")
    return speedup
