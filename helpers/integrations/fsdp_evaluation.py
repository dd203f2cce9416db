"""The held-out evaluation of a GPT-OSS model as TRL's trainer holds it in the ranks (under FSDP2 sharded,
under DDP whole), before the first step and after the last (`HeldOutEvaluation`), and what the LoRA adapters
received and how far the expert adapters moved (`AdapterUpdates`).

Why: the lesson evaluates inside the ranks, where the sharded model is, rather than gathering a 120B model
into one process.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from typing import Any

# tqdm's notebook check, run when transformers is first imported: progress bars come from helpers
warnings.filterwarnings("ignore", message="IProgress not found")

from transformers import TrainerCallback  # noqa: E402

from helpers.integrations.fsdp_tensors import full_value, local_shard  # noqa: E402


class AdapterUpdates(TrainerCallback):
    """LoRA: the gradient each trainable matrix received (the sum of |grad| over the steps, this rank's part)
    and how far each expert adapter moved from where it started (its largest change, gathered whole).

    `lora_A` gets no gradient until `lora_B`, which starts at zero, has moved once: after 3 steps both have.
    Put it after `ShardsFromRank0`, so that the starting values are the loaded ones.
    """

    def __init__(self) -> None:
        self.grad_sums: dict[str, float] = {}
        self.expert_change: dict[str, float] = {}
        self._before: dict[str, Any] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._before = {n: full_value(p) for n, p in model.named_parameters()
                        if "lora_" in n and ".experts." in n}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                              **kwargs: Any) -> None:
        for name, p in model.named_parameters():
            if p.requires_grad:
                grad = 0.0 if p.grad is None else float(local_shard(p.grad).abs().sum())
                self.grad_sums[name] = self.grad_sums.get(name, 0.0) + grad

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.expert_change = {n: float((full_value(p) - self._before[n]).abs().max())
                              for n, p in model.named_parameters() if n in self._before}
        self._before = {}

    def result(self) -> dict[str, Any]:
        return {"lora_grad_sums": self.grad_sums, "expert_adapter_change": self.expert_change}


@contextlib.contextmanager
def _root_gathered(model: Any) -> Iterator[None]:
    """Under FSDP2: the root module's own parameters gathered, for `generate`, which calls past the root's
    forward (the layers gather theirs in their forward); every FSDP group back to its shards afterwards, also
    those that stay gathered after a forward (the output layer). Without FSDP: nothing."""
    from torch.distributed.fsdp import FSDPModule

    groups = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if isinstance(model, FSDPModule):
        model.unshard()
    try:
        yield
    finally:
        for group in groups:
            group.reshard()


def evaluate_gpt_oss(model: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The in-rank evaluation of `helpers.integrations.sft_eval` on a GPT-OSS model as the trainer holds it
    (under FSDP2 sharded, under DDP whole): the held-out loss of all `rows`, each rank's share of the greedy
    answers gathered back in order on every rank, their exact match. Every rank calls it.

    Without the load-balancing loss (a training-time term), with the KV cache. The loss comes first: it runs
    the model's forward through the root module, from which FSDP2 sets itself up; `generate` on a PEFT model
    goes straight to the layers, which would fail under FSDP2 as the first forward.
    """
    from helpers.integrations.sft_eval import answer_budget, exact_match, greedy_answers, prompt_texts
    from helpers.integrations.transformers import answer_loss, gather_shares, rank_and_world, rank_share

    config = model.config
    routed, cached = config.output_router_logits, config.use_cache
    config.output_router_logits, config.use_cache = False, True
    try:
        loss = answer_loss(model, tokenizer, rows, over_ranks=True)
        mine, real = rank_share(rows)   # the same number of rows, so of generate calls, on every rank
        with _root_gathered(model):
            answers = greedy_answers(model, tokenizer, prompt_texts(tokenizer, mine),
                                     answer_budget(tokenizer, rows), synced_gpus=rank_and_world()[1] > 1)
    finally:
        config.output_router_logits, config.use_cache = routed, cached
    answers = gather_shares(answers, real, len(rows))
    return {"accuracy": exact_match(answers, rows), "answers": answers, "loss": loss}


class HeldOutEvaluation(TrainerCallback):
    """The held-out evaluation in the ranks, before the first step (on the loaded, prepared model: put it
    after `ShardsFromRank0`) and after the last: `results["before"]` and `results["after"]`, each as
    `evaluate_gpt_oss` returns it, and `results["seconds"]`, the time it took inside the trainer's `train()`
    (not training time). No rows: nothing is evaluated."""

    def __init__(self, tokenizer: Any, rows: list[dict[str, Any]] | None) -> None:
        self.tokenizer, self.rows = tokenizer, rows
        self.results: dict[str, Any] = {}
        self.seconds = 0.0   # spent evaluating, inside the trainer's train(): not training time

    def _evaluate(self, when: str, model: Any) -> None:
        if self.rows:
            start = time.perf_counter()
            self.results[when] = evaluate_gpt_oss(model, self.tokenizer, self.rows)
            self.seconds += time.perf_counter() - start
            self.results["seconds"] = self.seconds

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._evaluate("before", model)

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._evaluate("after", model)
