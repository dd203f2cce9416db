"""A fine-tuned LoRA adapter evaluated as a user would serve it: the base checkpoint loaded with transformers
in every rank, the adapter on top with PEFT, scored on held-out conversations; then merged into one plain
checkpoint.

Notebook 09 trains in Axolotl's own CLI function, which returns nothing and runs in another environment, so
its evaluation is a launch of its own in the gallery's environment (transformers and PEFT, no Axolotl):

    evaluate = distributed(evaluate_checkpoint, processes=processes)
    before = evaluate.distributed(model_path, test_rows)[0]
    after = evaluate.distributed(model_path, test_rows, adapter=output_dir, merged_dir=merged)[0]

Every rank holds the whole model on its own device (a GPU each, in bf16; fp32 on CPU), as DDP trains it,
loaded straight there from the checkpoint's files (`device_map`), so the host keeps no copy per rank; each
answers its share of the rows (`helpers.integrations.sft_eval.evaluate_in_ranks`).
"""

from __future__ import annotations

from typing import Any

from helpers.integrations.sft_eval import answer_budget, greedy_answers, prompt_texts


def evaluate_checkpoint(model_path: str, rows: list[dict[str, Any]], *, adapter: str | None = None,
                        merged_dir: str | None = None) -> dict[str, Any] | None:
    """In every rank of a launch: exact match, answers and held-out loss of the base model at `model_path`
    (with the LoRA `adapter` folder on top, loaded with PEFT); rank 0 returns them, with the dtype it ran in.

    `merged_dir`: rank 0 also merges the adapter into the base weights (`merge_and_unload`: each
    `W + (lora_alpha / lora_r) B @ A` becomes one plain weight; modules trained in full replace the base's)
    and saves the merged model and the adapter's tokenizer there: a checkpoint transformers loads alone.
    Paths are absolute (Ray workers run in folders of their own); a hub id is passed as it is.
    """
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from helpers.context import worker_context
    from helpers.integrations.sft_eval import evaluate_in_ranks

    ctx = worker_context()
    if ctx.device.startswith("cuda"):
        torch.cuda.set_device(ctx.device)
    dist.init_process_group(ctx.backend)
    try:
        dtype = torch.float32 if ctx.device == "cpu" else torch.bfloat16
        # straight onto this rank's device (from the checkpoint's files): the host keeps no copy of its own
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, device_map={"": ctx.device})
        tokenizer = AutoTokenizer.from_pretrained(adapter or model_path)
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter)
        scores = evaluate_in_ranks(model, tokenizer, rows, device=ctx.device)
        if merged_dir is not None and ctx.rank == 0:
            model.merge_and_unload().save_pretrained(merged_dir)
            tokenizer.save_pretrained(merged_dir)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return dict(scores, dtype=str(dtype).removeprefix("torch.")) if ctx.rank == 0 else None


def answers_in_rank_batches(model: Any, tokenizer: Any, rows: list[dict[str, Any]], world: int) -> list[str]:
    """The greedy answers `world` ranks gave to `rows`, recomputed in one process in the ranks' own batches:
    each rank's share in turn (rows `rank, rank + world, ...`, padded with the first row as `rank_share` pads
    it). A batch's padding moves the last digits of a forward pass, so only the same batches give the same
    answers bit for bit: what the kernel's reload check compares."""
    per_rank = -(-len(rows) // world)
    budget = answer_budget(tokenizer, rows)
    answers: list[str] = [""] * len(rows)
    for rank in range(world):
        share = rows[rank::world]
        padded = share + [rows[0]] * (per_rank - len(share))
        prompts = prompt_texts(tokenizer, padded)
        answers[rank::world] = greedy_answers(model, tokenizer, prompts, budget)[:len(share)]
    return answers
