"""The SFT data builder (helpers.data.sft_tasks) and the offline chat tokenizer
(helpers.models.char_tokenizer)."""

import json

import pytest

from helpers.data.sft_tasks import build_sft_tasks, validate_sft_jsonl


def _answer(task, prompt):
    body = prompt.split(": ", 1)[1]
    if task == "reverse":
        return body[::-1]
    if task == "sort":
        return "".join(sorted(body))
    a, b = body.split("+")
    return str(int(a) + int(b))


@pytest.mark.parametrize("task", ["reverse", "sort", "add"])
def test_format_answers_and_held_out_split(tmp_path, task):
    paths = build_sft_tasks(task, n_train=150, n_test=30, seed=3, root=tmp_path / task)
    train, test = validate_sft_jsonl(paths["train"]), validate_sft_jsonl(paths["test"])
    assert (len(train), len(test)) == (150, 30)
    for row in train + test:
        user, assistant = row["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        assert assistant["content"] == _answer(task, user["content"])  # exactly one right answer
    train_prompts = {r["messages"][0]["content"] for r in train}
    test_prompts = [r["messages"][0]["content"] for r in test]
    assert len(set(test_prompts)) == len(test_prompts) and not train_prompts & set(test_prompts)


def test_deterministic_and_reused(tmp_path):
    a = build_sft_tasks("reverse", n_train=100, n_test=20, seed=7, root=tmp_path / "a")
    b = build_sft_tasks("reverse", n_train=100, n_test=20, seed=7, root=tmp_path / "b")
    for split in ("train", "test"):
        assert a[split].read_bytes() == b[split].read_bytes()  # same seed, same bytes
    c = build_sft_tasks("reverse", n_train=100, n_test=20, seed=8, root=tmp_path / "c")
    assert c["train"].read_bytes() != a["train"].read_bytes()
    mtime = a["train"].stat().st_mtime_ns
    build_sft_tasks("reverse", n_train=100, n_test=20, seed=7, root=tmp_path / "a")
    assert a["train"].stat().st_mtime_ns == mtime  # identical build reused, not rewritten
    build_sft_tasks("reverse", n_train=120, n_test=20, seed=7, root=tmp_path / "a")
    assert len(a["train"].read_text().splitlines()) == 120  # other arguments rebuild


def test_bad_builder_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown task"):
        build_sft_tasks("divide", root=tmp_path)
    with pytest.raises(ValueError, match="only 10000 exist"):
        build_sft_tasks("add", n_train=9000, n_test=10, root=tmp_path)  # only 100 x 100 sums exist


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_validation_accepts_a_user_file(tmp_path):
    good = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"},
                         {"role": "assistant", "content": "4"}], "source": "extra fields are fine"}
    rows = validate_sft_jsonl(_write(tmp_path / "good.jsonl", [json.dumps(good), ""]))
    assert rows == [good]


@pytest.mark.parametrize("line, message", [
    ('{"conversation": []}', r"line 2 has no 'messages' field"),
    ('{"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]}',
     r"line 2: message 0 has no 'content'"),
    ('{"messages": [{"content": "hi"}]}', r"line 2: message 0 has no 'role'"),
    ('{"messages": [{"role": "bot", "content": "hi"}]}', r"role 'bot'"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', r"last message must be the assistant's reply"),
    ('{"messages": [{"role": "assistant", "content": "hi"}]}', r"no user message"),
    ('{"messages": []}', r"non-empty list"),
    ('not json', r"line 2 is not valid JSON"),
])
def test_validation_names_the_line_and_the_field(tmp_path, line, message):
    ok = json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
    path = _write(tmp_path / "bad.jsonl", [ok, line])
    with pytest.raises(ValueError, match=message):
        validate_sft_jsonl(path)


def test_validation_missing_or_empty_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        validate_sft_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="empty"):
        validate_sft_jsonl(_write(tmp_path / "empty.jsonl", [""]))


def test_char_tokenizer_round_trip_and_assistant_mask(tmp_path):
    from transformers import AutoTokenizer

    from helpers.models.char_tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)  # reloads like a hub tokenizer
    messages = [{"role": "user", "content": "reverse: abc"}, {"role": "assistant", "content": "cba"}]
    enc = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    ids, mask = enc["input_ids"], enc["assistant_masks"]
    assert tok.decode(ids) == "<|user|>reverse: abc<|assistant|>cba<|end|>"
    # Only the answer and its end-of-turn token are trained on.
    answer = tok("cba", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert [i for i, m in zip(ids, mask, strict=True) if m] == answer
    assert tok.decode(tok("Hello, 42!")["input_ids"]) == "Hello, 42!"
    assert tok.eos_token == "<|end|>" and tok.pad_token == "<pad>"
