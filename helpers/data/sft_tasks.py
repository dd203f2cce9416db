"""A supervised fine-tuning data set in chat (``messages``) format, with answers that can be checked exactly.

Why this exists: fine-tuning a language model is usually judged by loss alone, which says little about
whether the model learned the task. Here every example is a short string transformation with exactly one
right answer (reverse the letters, sort the letters, add two numbers), so held-out *exact-match accuracy*
of generated answers measures learning without a judge model. The tasks are small enough that a tiny
Llama-architecture model, built from scratch on the driver, learns them in about a minute of CPU training.

The files use the format that TRL's ``SFTTrainer`` (and most chat fine-tuning tools) read: JSON Lines, one
conversation per line::

    {"messages": [{"role": "user", "content": "reverse: kqzb"}, {"role": "assistant", "content": "bzqk"}]}

The last message is the assistant's reply: the reference answer used for exact-match evaluation. A user's
own file in this format is checked by :func:`validate_sft_jsonl` before any process is launched.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from helpers.data.builds import digest, reuse_or_build
from helpers.paths import cache_dir

TASKS = ("reverse", "sort", "add")
ROLES = ("system", "user", "assistant")
LETTERS = "abcdefghijklmnopqrstuvwxyz"
_FORMAT_VERSION = 1


def make_example(task: str, rng: random.Random, min_len: int = 3, max_len: int = 6) -> dict[str, Any]:
    """One conversation for `task`: the user's request and the one right answer."""
    if task == "reverse":
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(min_len, max_len)))
        prompt, answer = f"reverse: {word}", word[::-1]
    elif task == "sort":
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(min_len, max_len)))
        prompt, answer = f"sort: {word}", "".join(sorted(word))
    elif task == "add":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        prompt, answer = f"add: {a}+{b}", str(a + b)
    else:
        raise ValueError(f"unknown task {task!r}: choose from {TASKS}")
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


def _generate(task: str, n: int, seed: int, min_len: int, max_len: int,
              exclude: set[str] | None = None) -> list[dict[str, Any]]:
    """`n` distinct examples (distinct prompts), none of whose prompts is in `exclude`."""
    rng = random.Random(f"{task}-{seed}")  # str seeds are hashed deterministically (not by PYTHONHASHSEED)
    seen = set(exclude or ())
    out: list[dict[str, Any]] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"cannot draw {n} distinct {task!r} examples with lengths {min_len}-{max_len}: "
                             "lower the number of examples or widen the lengths.")
        ex = make_example(task, rng, min_len, max_len)
        prompt = ex["messages"][0]["content"]
        if prompt not in seen:
            seen.add(prompt)
            out.append(ex)
    return out


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    tmp.replace(path)


def build_sft_tasks(task: str = "reverse", n_train: int = 4000, n_test: int = 200, seed: int = 0,
                    min_len: int = 3, max_len: int = 6, root: str | Path | None = None) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``test.jsonl`` (held out: no prompt of the test set is in the training set).

    Deterministic: the same arguments give the same bytes. A build whose ``manifest.json`` holds the same
    arguments is reused, so re-running a notebook costs nothing. Returns the paths of both files.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: choose one of {TASKS}")
    if n_train < 1 or n_test < 1:
        raise ValueError(f"n_train={n_train} and n_test={n_test} must both be at least 1")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"lengths must satisfy 1 <= min_len <= max_len, got {min_len}, {max_len}")
    capacity = 100 * 100 if task == "add" else sum(26 ** n for n in range(min_len, max_len + 1))
    if n_train + n_test > capacity // 2:  # keep rejection sampling of distinct prompts fast
        raise ValueError(f"{n_train + n_test} distinct {task!r} prompts asked for, but only {capacity} "
                         "exist: lower n_train/n_test" + ("" if task == "add" else " or raise max_len") + ".")
    args = {"task": task, "n_train": n_train, "n_test": n_test, "seed": seed, "min_len": min_len,
            "max_len": max_len, "version": _FORMAT_VERSION}
    key = digest(args, 10, "sha1")
    folder = Path(root) if root is not None else cache_dir("sft_tasks", f"{task}-{key}")
    paths = {"train": folder / "train.jsonl", "test": folder / "test.jsonl"}

    def write() -> None:
        # The held-out prompts are drawn first, then excluded from training: no test question is memorised.
        test = _generate(task, n_test, seed + 1_000_003, min_len, max_len)
        train = _generate(task, n_train, seed, min_len, max_len,
                          exclude={ex["messages"][0]["content"] for ex in test})
        _write_jsonl(paths["train"], train)
        _write_jsonl(paths["test"], test)

    reuse_or_build(folder, args, paths.values(), write)
    return paths


def validate_sft_jsonl(path: str | Path, require_answer: bool = True) -> list[dict[str, Any]]:
    """Read a chat-format JSONL file and check every line; raise a ValueError naming the line and the fix.

    Each line must be a JSON object with a ``messages`` list of ``{"role": ..., "content": ...}`` objects,
    roles among system/user/assistant, with at least one user message. With ``require_answer`` (needed for
    exact-match evaluation) the last message must be the assistant's reply. Returns the parsed rows.
    """
    path = Path(path)
    example = ('{"messages": [{"role": "user", "content": "reverse: abc"}, '
               '{"role": "assistant", "content": "cba"}]}')
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: pass the path of a JSONL file with one conversation "
                                f"per line, like {example}")
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where} is not valid JSON ({e.msg}). Each line must be one object like "
                                 f"{example}") from None
            if not isinstance(row, dict) or "messages" not in row:
                raise ValueError(
                    f"{where} has no 'messages' field. Each line must be an object like {example}")
            messages = row["messages"]
            if not isinstance(messages, list) or not messages:
                raise ValueError(
                    f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects")
            for i, m in enumerate(messages):
                for field in ("role", "content"):
                    if not isinstance(m, dict) or field not in m:
                        raise ValueError(f"{where}: message {i} has no '{field}' field. Every message needs "
                                         f"both 'role' and 'content', e.g. {example}")
                if m["role"] not in ROLES:
                    raise ValueError(f"{where}: message {i} has role {m['role']!r}; use one of {ROLES}")
                if not isinstance(m["content"], str):
                    raise ValueError(f"{where}: message {i} 'content' must be a string, "
                                     f"not {type(m['content']).__name__}")
            if not any(m["role"] == "user" for m in messages):
                raise ValueError(f"{where} has no user message: each conversation needs a user turn")
            if require_answer and messages[-1]["role"] != "assistant":
                raise ValueError(f"{where}: the last message must be the assistant's reply (the reference "
                                 "answer for exact-match evaluation); it is a "
                                 f"{messages[-1]['role']!r} message")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no conversations: it is empty")
    return rows


def check_learning(step_losses: list[float], *, heldout_before: float, heldout_after: float, built_in: bool,
                   accuracy_before: float | None = None, accuracy_after: float | None = None,
                   bar: float | None = 0.8) -> str:
    """The fine-tuning notebooks' learning checks; raises AssertionError naming the one that failed, else
    returns a line saying what held.

    Any data and model: the held-out loss on answer tokens fell (the model learned something that carries over
    to conversations it never saw) and the training loss fell (the mean of the last quarter of the steps, at
    most 25, below the mean of the first). On the built-in tasks (`built_in`: no `model_name`, no
    `dataset_path`) the bars of a random model learning a task with one right answer as well: the training
    loss fell 4x, the untrained model scored below 5% exact match (else the task leaks), fine-tuning raised
    exact match, to `bar` or above where one is given. The line returned names the checks and no figure: the
    evaluation cells print those. A pretrained model on a user's chats does neither: free-form
    answers are almost never an exact match, and its loss starts low.
    """
    losses = [float(x) for x in step_losses]
    window = max(1, min(25, len(losses) // 4))
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    fell = last < 0.25 * first if built_in else last < first
    assert fell, (f"training loss did not fall{' 4x' if built_in else ''}: {first:.4f} over the first "
                  f"{window} steps, {last:.4f} over the last")
    assert heldout_after < heldout_before, (
        f"the held-out loss did not fall: {heldout_before:.4f} before fine-tuning, {heldout_after:.4f} after")
    if not built_in:
        return "your model or data: the training loss and the held-out loss fell"
    assert accuracy_before is not None and accuracy_after is not None, "give the exact match before and after"
    assert accuracy_before < 0.05, f"an untrained model scored {accuracy_before:.3f}: the task leaks"
    if bar is not None:
        assert accuracy_after >= bar, f"held-out exact match {accuracy_after:.3f} is below the bar {bar}"
    assert accuracy_after > accuracy_before, "fine-tuning did not improve held-out accuracy"
    return ("the built-in task's bars held: the training loss fell 4x, the held-out loss fell, held-out "
            "exact match rose from below 0.05" + (f" to {bar} or above" if bar is not None else ""))
