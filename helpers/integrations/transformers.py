"""transformers (Trainer, TRL's SFTTrainer): a callback that draws rank 0's optimiser steps in the launching
notebook; the warm-up keywords of the installed transformers; and, for the fine-tuning notebooks' evaluations,
what a model's forward takes of a tokenizer's output, the held-out loss on answer tokens, and the split of an
evaluation over the ranks that hold a sharded model."""

from __future__ import annotations

from typing import Any

from helpers.progress import RankProgress, progress_bar


def transformers_progress_callback(desc: str = "training") -> Any:
    """A `transformers.TrainerCallback` (Trainer, TRL's SFTTrainer) that draws the optimiser steps through
    `progress_bar`, with the last logged loss. Use it with `disable_tqdm=True`."""
    from transformers import TrainerCallback

    class HelpersProgressCallback(TrainerCallback):
        def __init__(self) -> None:
            self._bar: RankProgress[Any] | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._bar = progress_bar(total=state.max_steps, desc=desc, unit="step",
                                     rank=0 if state.is_world_process_zero else 1)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._bar is not None:
                self._bar.update(state.global_step - self._bar.n)

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
                   **kwargs: Any) -> None:
            if self._bar is not None and logs and "loss" in logs:
                self._bar.set_postfix(loss=float(logs["loss"]))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    return HelpersProgressCallback()


def warmup(ratio: float) -> dict[str, float]:
    """`TrainingArguments` / `SFTConfig` keywords for a warm-up over `ratio` of the steps, in the installed
    transformers: `warmup_ratio` up to 4.x; 5.x removed it and takes a fraction below 1 as `warmup_steps`."""
    from importlib.metadata import version  # not `import transformers`: a rank may not have imported it yet

    major = int(version("transformers").split(".")[0])
    return {"warmup_ratio": ratio} if major < 5 else {"warmup_steps": ratio}


def _forward_of(model: Any) -> Any:
    """The forward of the model itself, under PEFT's (or DDP's) wrappers, whose forward takes anything."""
    while True:
        if hasattr(model, "get_base_model"):      # PeftModel
            model = model.get_base_model()
        elif hasattr(model, "module"):            # DistributedDataParallel
            model = model.module
        else:
            return model.forward


def generation_inputs(model: Any, encoding: Any) -> dict[str, Any]:
    """The tensors of a tokenizer's `encoding` that the model's forward takes by name, for `model.generate` or
    `model(...)`. A plain `PreTrainedTokenizerFast` returns `token_type_ids`, which Llama, GPT-OSS and OLMo
    take no argument for, and `generate` refuses with "The following `model_kwargs` are not used by the
    model"."""
    import inspect

    named = {name for name, p in inspect.signature(_forward_of(model)).parameters.items()
             if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    named |= {"input_ids", "attention_mask"}
    return {key: value for key, value in encoding.items() if key in named}


def rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_share(rows: list[Any]) -> tuple[list[Any], int]:
    """This rank's part of an evaluation over every rank: rows `rank, rank+world, ...`, padded with copies of
    the first row to the same length on every rank, and how many of them are real. Under FSDP and ZeRO-3 every
    forward pass gathers parameters, a collective every rank must join, so each rank must run as many batches
    as the others even when the rows do not split evenly. Outside a process group: all rows."""
    if not rows:
        raise ValueError("an evaluation over the ranks needs at least one row")
    rank, world = rank_and_world()
    mine = rows[rank::world]
    per_rank = -(-len(rows) // world)
    return mine + [rows[0]] * (per_rank - len(mine)), len(mine)


def gather_shares(values: list[Any], real: int, total: int) -> list[Any]:
    """The values every rank computed for its `rank_share`, back in the rows' order, on every rank."""
    import torch.distributed as dist

    rank, world = rank_and_world()
    if world == 1:
        return list(values[:real])
    parts: list[Any] = [None] * world
    dist.all_gather_object(parts, list(values[:real]))
    ordered = [None] * total
    for r, part in enumerate(parts):
        ordered[r::world] = part
    return ordered


def _answer_sequences(tokenizer: Any, rows: list[dict[str, Any]], real: int) -> list[tuple[list[int], int]]:
    """Each conversation's tokens and where its answer starts, the answer being what the full conversation's
    chat template adds to the prompt's; the rows from `real` on (a `rank_share`'s padding) get no answer
    tokens, so they count for nothing."""
    sequences = []
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], tokenize=False,
                                               add_generation_prompt=True)
        full = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        if not full.startswith(prompt):
            raise ValueError("the chat template renders the conversation without its prompt as a prefix: "
                             f"the answer tokens cannot be told apart ({prompt[-40:]!r})")
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        whole = tokenizer(full, add_special_tokens=False)["input_ids"]
        # as TRL does: the completion is what the whole conversation's tokens add to the prompt's
        answer = whole[len(ids):] if whole[:len(ids)] == ids else tokenizer(full[len(prompt):],
                                                                             add_special_tokens=False)["input_ids"]
        sequences.append((ids + answer, len(ids)))
    return [(ids, start if k < real else len(ids)) for k, (ids, start) in enumerate(sequences)]


def answer_loss(model: Any, tokenizer: Any, rows: list[dict[str, Any]], batch: int = 64,
                device: Any = None, over_ranks: bool = False) -> float:
    """Mean cross-entropy per answer token of held-out conversations: each conversation's last (assistant)
    message, after the rest in the model's chat template, end-of-turn token included, as `SFTTrainer` computes
    the training loss on prompt-completion pairs (the completion is what the full conversation's template adds
    to the prompt's, `add_generation_prompt=True`). Works for any data, where exact match needs one right
    answer; a model that generalises scores lower after fine-tuning than before. With `over_ranks`, inside a
    process group, every rank scores its `rank_share` of the rows (a sharded model: all ranks take part in
    every forward) and the sums are added across the ranks: every rank returns the loss of all rows."""
    import torch

    device = device if device is not None else next(model.parameters()).device
    rank, world = rank_and_world() if over_ranks else (0, 1)
    real = len(rows)
    if world > 1:
        rows, real = rank_share(rows)
    sequences = _answer_sequences(tokenizer, rows, real)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(sequences), batch):
            chunk = sequences[i:i + batch]
            width = max(len(ids) for ids, _ in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            labels = torch.full((len(chunk), width), -100, dtype=torch.long)
            for j, (ids, start) in enumerate(chunk):   # right padding: positions start at 0 in every row
                input_ids[j, :len(ids)] = torch.tensor(ids)
                mask[j, :len(ids)] = 1
                labels[j, start:len(ids)] = torch.tensor(ids[start:])
            logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits.float()
            shifted = labels[:, 1:].to(device)
            losses = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), shifted.reshape(-1), ignore_index=-100,
                reduction="sum")
            total += float(losses)
            count += int((shifted != -100).sum())
    model.train(was_training)
    if world > 1:
        import torch.distributed as dist

        sums = torch.tensor([total, float(count)], dtype=torch.float64, device=device)
        dist.all_reduce(sums)
        total, count = float(sums[0]), int(sums[1])
    return total / count


def save_streamed(named_tensors: Any, folder: str, is_main: bool, max_shard_bytes: int = 2**30) -> list[str]:
    """Write a model's weights as safetensors files with an index, the layout `from_pretrained` reads, from
    `(name, tensor)` pairs gathered one at a time. Every rank iterates the pairs (under FSDP each gather is a
    collective every rank joins); the main rank keeps a tensor only until its file of `max_shard_bytes` is
    written, so no process ever holds the whole model, whatever its size. Returns the files written (main
    rank)."""
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    out = Path(folder)
    buffer: dict[str, Any] = {}
    size, total, files, weight_map = 0, 0, [], {}

    def flush() -> None:
        nonlocal buffer, size
        if buffer:
            name = f"model-{len(files) + 1:05d}.safetensors"
            save_file(buffer, str(out / name), metadata={"format": "pt"})
            files.append(name)
            weight_map.update(dict.fromkeys(buffer, name))
            buffer, size = {}, 0

    if is_main:   # weights an earlier save left here would be read instead of (or mixed with) these
        out.mkdir(parents=True, exist_ok=True)
        for stale in [*out.glob("model*.safetensors"), *out.glob("model.safetensors.index.json"),
                      *out.glob("pytorch_model*.bin"), *out.glob("pytorch_model.bin.index.json")]:
            stale.unlink()
    for name, tensor in named_tensors:
        if not is_main:
            continue
        buffer[name] = tensor.contiguous()
        size += tensor.numel() * tensor.element_size()
        total += tensor.numel() * tensor.element_size()
        if size >= max_shard_bytes:
            flush()
    if not is_main:
        return []
    flush()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return files


def with_step_losses(trainer_class: Any) -> Any:
    """`trainer_class` (transformers' Trainer, TRL's SFTTrainer) that keeps this rank's loss of every training
    step in `trainer.step_losses`: the curve the lessons plot and compare across strategies, where the
    trainer's own log averages over `logging_steps`. The loss is the one the step back-propagated: with
    `num_items_in_batch` (the answer tokens of the whole global batch) every rank's loss is a share of the
    global batch's, so the mean over ranks is the global batch's loss."""

    class StepLossTrainer(trainer_class):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.step_losses: list[float] = []

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            loss = super().training_step(model, inputs, num_items_in_batch)
            self.step_losses.append(loss.item())
            return loss

    StepLossTrainer.__name__ = StepLossTrainer.__qualname__ = f"StepLoss{trainer_class.__name__}"
    return StepLossTrainer
