"""The held-out evaluation of the fine-tuning lessons (05, 07, 08, 09), run inside the ranks on the model as
they hold it: greedy answers to each conversation's prompt, their exact match with the reference answer, and
the held-out loss on the answer tokens.

Why in the ranks: at real size no process but the ranks holds the model (ZeRO-3 and FSDP shard it), so the
kernel never loads one to evaluate it. Every rank must call `evaluate_in_ranks` (a sharded forward is a
collective); each answers its `rank_share` of the rows and every rank gets all the answers back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from helpers.integrations.transformers import (
    answer_loss,
    gather_shares,
    generation_inputs,
    rank_and_world,
    rank_share,
)


def prompt_texts(tokenizer: Any, rows: list[dict[str, Any]]) -> list[str]:
    """Each conversation but its answer, in the model's chat template, ending where the answer begins."""
    return [tokenizer.apply_chat_template(r["messages"][:-1], tokenize=False, add_generation_prompt=True)
            for r in rows]


def answer_budget(tokenizer: Any, rows: list[dict[str, Any]]) -> int:
    """New tokens to generate: the longest reference answer's, plus 2 (the end-of-turn token and one more)."""
    return max(len(tokenizer(r["messages"][-1]["content"], add_special_tokens=False)["input_ids"])
               for r in rows) + 2


def reference_answers(rows: list[dict[str, Any]]) -> list[str]:
    return [r["messages"][-1]["content"].strip() for r in rows]


def exact_match(answers: list[str], rows: list[dict[str, Any]]) -> float:
    """The share of answers equal to the reference answer (surrounding blanks aside)."""
    return sum(a == b for a, b in zip(answers, reference_answers(rows), strict=True)) / len(rows)


def greedy_answers(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int, *, batch: int = 256,
                   device: Any = None, synced_gpus: bool = False) -> list[str]:
    """The model's greedy answers to prompts already in its chat template, stopped at the end-of-turn token.

    The model stays where it is (a ZeRO-3 or FSDP model is sharded over the ranks and cannot be moved);
    `synced_gpus=True` keeps every rank generating until all are done, as sharded forwards need. Padding goes
    on the left for generation and is put back afterwards, for the trainer's collator.
    """
    import torch

    device = device if device is not None else next(model.parameters()).device
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"               # generation appends on the right
    if tokenizer.pad_token is None:               # Llama 3 tokenizers ship without one: pad with end-of-text
        tokenizer.pad_token = tokenizer.eos_token
    answers: list[str] = []
    try:
        for i in range(0, len(prompts), batch):
            enc = tokenizer(prompts[i:i + batch], return_tensors="pt", padding=True,
                            add_special_tokens=False).to(device)
            with torch.no_grad():
                out = model.generate(**generation_inputs(model, enc), max_new_tokens=max_new_tokens,
                                     do_sample=False, pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=tokenizer.eos_token_id, synced_gpus=synced_gpus)
            answers += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        model.train(was_training)
        tokenizer.padding_side = side
    return [a.strip() for a in answers]


def evaluate_in_ranks(model: Any, tokenizer: Any, rows: list[dict[str, Any]], *, device: Any = None,
                      answer: Callable[..., list[str]] | None = None) -> dict[str, Any]:
    """Inside a rank, and every rank must call it: the exact match, the answers and the held-out loss of all
    `rows`, each rank computing its share on the model as it holds it; every rank returns the figures for all.

    `answer(model, tokenizer, prompts, max_new_tokens)` replaces `greedy_answers` where a framework generates
    its own way (Unsloth's inference mode).
    """
    world = rank_and_world()[1]
    mine, real = rank_share(rows)   # the same number of rows, so of generate calls, on every rank
    prompts, budget = prompt_texts(tokenizer, mine), answer_budget(tokenizer, rows)
    if answer is None:
        answers = greedy_answers(model, tokenizer, prompts, budget, device=device, synced_gpus=world > 1)
    else:
        answers = answer(model, tokenizer, prompts, budget)
    answers = gather_shares(answers, real, len(rows))
    return {"accuracy": exact_match(answers, rows), "answers": answers,
            "loss": answer_loss(model, tokenizer, rows, device=device, over_ranks=True)}
