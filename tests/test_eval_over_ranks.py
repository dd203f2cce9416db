"""The evaluation split over ranks (helpers.integrations.transformers): the held-out loss of all rows on every
rank equals the one-process loss, whatever the split, and the ranks' answers come back in the rows' order."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rows(n: int) -> list[dict]:
    words = ["cab", "dog", "emu", "fox", "gnu", "hen", "ibis"]
    return [{"messages": [{"role": "user", "content": f"reverse {w}"},
                          {"role": "assistant", "content": w[::-1]}]} for w in words[:n]]


def _model_and_tokenizer():
    from transformers import LlamaConfig, LlamaForCausalLM

    from helpers.models.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval(), tokenizer


def _rank(rank: int, world: int, port: int, n: int, batch: int, out: dict) -> None:
    from helpers.integrations.transformers import answer_loss, gather_shares, rank_share

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, tokenizer = _model_and_tokenizer()
        rows = _rows(n)
        mine, real = rank_share(rows)
        answers = gather_shares([r["messages"][0]["content"] for r in mine], real, len(rows))
        from helpers.integrations.sft_eval import evaluate_in_ranks

        out[rank] = {"loss": answer_loss(model, tokenizer, rows, batch=batch, over_ranks=True),
                     "answers": answers, "share": len(mine),
                     "evaluation": evaluate_in_ranks(model, tokenizer, rows)}
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world,n,batch", [(2, 5, 2), (3, 7, 64)])
def test_the_loss_over_ranks_is_the_one_process_loss(world, n, batch):
    from helpers.integrations.sft_eval import evaluate_in_ranks
    from helpers.integrations.transformers import answer_loss
    from helpers.launch.local import free_port

    model, tokenizer = _model_and_tokenizer()
    expected = answer_loss(model, tokenizer, _rows(n), batch=batch)
    alone = evaluate_in_ranks(model, tokenizer, _rows(n))   # outside a process group: one share of all rows
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank, args=(world, free_port(), n, batch, out), nprocs=world,
                           start_method="spawn")
        results = dict(out)
    assert sorted(results) == list(range(world))
    for r in results.values():
        assert r["loss"] == pytest.approx(expected, rel=1e-5)   # padding rows count for nothing
        assert r["answers"] == [row["messages"][0]["content"] for row in _rows(n)]
        assert r["share"] == -(-n // world)   # every rank runs the same number of rows
        # the ranks' greedy answers, gathered in order, are the one process's; so are exact match and loss
        assert r["evaluation"]["answers"] == alone["answers"] and len(alone["answers"]) == n
        assert r["evaluation"]["accuracy"] == alone["accuracy"]
        assert r["evaluation"]["loss"] == pytest.approx(alone["loss"], rel=1e-5)


def test_outside_a_process_group_everything_is_one_share():
    from helpers.integrations.transformers import gather_shares, rank_share

    rows = _rows(3)
    assert rank_share(rows) == (rows, 3)
    assert gather_shares([1, 2, 3], 3, 3) == [1, 2, 3]
    with pytest.raises(ValueError, match="at least one row"):
        rank_share([])


def test_exact_match_compares_with_the_reference_answers():
    from helpers.integrations.sft_eval import answer_budget, exact_match, prompt_texts

    _, tokenizer = _model_and_tokenizer()
    rows = _rows(4)
    assert exact_match(["bac", "god", "ume", "x"], rows) == 0.75
    assert prompt_texts(tokenizer, rows[:1]) == ["<|user|>reverse cab<|assistant|>"]
    assert answer_budget(tokenizer, rows) == 3 + 2   # the longest answer, the end-of-turn token and one more


def test_a_streamed_save_is_a_from_pretrained_folder(tmp_path):
    """save_streamed writes files of at most the given size (one tensor may pass it), an index, and removes
    the
    weights an earlier save left in the folder, which from_pretrained would read instead."""
    from transformers import AutoModelForCausalLM

    from helpers.integrations.transformers import save_streamed

    model, _ = _model_and_tokenizer()
    model.save_pretrained(tmp_path)   # an earlier save: model.safetensors
    torch.manual_seed(1)
    for p in model.parameters():
        p.data.normal_()
    state = model.state_dict()
    size = sum(t.numel() * t.element_size() for t in state.values())
    files = save_streamed(iter(state.items()), str(tmp_path), is_main=True, max_shard_bytes=size // 3)
    assert len(files) >= 3 and not (tmp_path / "model.safetensors").exists()
    model.config.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    assert save_streamed(iter(state.items()), str(tmp_path / "other"), is_main=False) == []
    assert not (tmp_path / "other").exists()   # only the main rank writes
