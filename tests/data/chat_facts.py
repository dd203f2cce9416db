"""A small natural-language chat data set, and a pretrained-looking model to fine-tune on it, for the tests
that run the fine-tuning notebooks (05, 07) as a user runs them on their own data (`dataset_path`,
`model_name`).

`python -m tests.data.chat_facts` writes `tests/data/chat_facts.jsonl`: questions and answers, in full
sentences, about a small table of chemical elements (symbol, atomic number, state at room temperature, group),
four phrasings each, one conversation a line in the chat (`messages`) format. Free-form answers: exact match
is not the point, the held-out loss is.

`pretrained_looking(arch)` saves a tiny Llama or GPT-OSS with a plain `PreTrainedTokenizerFast` (it returns
`token_type_ids`, as such tokenizers do unless `model_input_names` says otherwise), first trained for a short
warm-up on the same kind of conversations about other elements: it knows the format, so its loss starts low
and falls far less than 4x, as a pretrained model's does.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
JSONL = HERE / "chat_facts.jsonl"

# (name, symbol, atomic number, state at room temperature, group): the table the data set asks about
ELEMENTS = [
    ("hydrogen", "H", 1, "gas", "nonmetal"),
    ("helium", "He", 2, "gas", "noble gas"),
    ("lithium", "Li", 3, "solid", "alkali metal"),
    ("carbon", "C", 6, "solid", "nonmetal"),
    ("nitrogen", "N", 7, "gas", "nonmetal"),
    ("oxygen", "O", 8, "gas", "nonmetal"),
    ("fluorine", "F", 9, "gas", "halogen"),
    ("neon", "Ne", 10, "gas", "noble gas"),
    ("sodium", "Na", 11, "solid", "alkali metal"),
    ("magnesium", "Mg", 12, "solid", "alkaline earth metal"),
    ("aluminium", "Al", 13, "solid", "metal"),
    ("silicon", "Si", 14, "solid", "metalloid"),
    ("sulfur", "S", 16, "solid", "nonmetal"),
    ("chlorine", "Cl", 17, "gas", "halogen"),
    ("argon", "Ar", 18, "gas", "noble gas"),
    ("potassium", "K", 19, "solid", "alkali metal"),
    ("calcium", "Ca", 20, "solid", "alkaline earth metal"),
    ("iron", "Fe", 26, "solid", "transition metal"),
    ("copper", "Cu", 29, "solid", "transition metal"),
    ("bromine", "Br", 35, "liquid", "halogen"),
]
# the warm-up's table: other elements, the same phrasings
WARMUP_ELEMENTS = [
    ("beryllium", "Be", 4, "solid", "alkaline earth metal"),
    ("boron", "B", 5, "solid", "metalloid"),
    ("phosphorus", "P", 15, "solid", "nonmetal"),
    ("titanium", "Ti", 22, "solid", "transition metal"),
    ("chromium", "Cr", 24, "solid", "transition metal"),
    ("nickel", "Ni", 28, "solid", "transition metal"),
    ("zinc", "Zn", 30, "solid", "transition metal"),
    ("krypton", "Kr", 36, "gas", "noble gas"),
    ("silver", "Ag", 47, "solid", "transition metal"),
    ("iodine", "I", 53, "solid", "halogen"),
    ("xenon", "Xe", 54, "gas", "noble gas"),
    ("gold", "Au", 79, "solid", "transition metal"),
    ("mercury", "Hg", 80, "liquid", "transition metal"),
    ("lead", "Pb", 82, "solid", "metal"),
]
SYSTEM = "You answer questions about the chemical elements in one short sentence."


def conversations(elements=ELEMENTS) -> list[dict]:
    """Four questions about every element of the table, each with its answer in a full sentence."""
    rows = []
    for name, symbol, number, state, group in elements:
        cap = name.capitalize()
        pairs = [
            (f"What is the chemical symbol of {name}?", f"The symbol of {name} is {symbol}."),
            (f"What is the atomic number of {name}?", f"{cap} has atomic number {number}."),
            (
                f"Which element has the symbol {symbol}?",
                f"{symbol} is the symbol of {name}, element {number}.",
            ),
            (
                f"Is {name} a solid, a liquid or a gas at room temperature?",
                f"At room temperature {name} is a {state}; it is a {group}.",
            ),
        ]
        rows += [
            {
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": q},
                    {"role": "assistant", "content": a},
                ]
            }
            for q, a in pairs
        ]
    return rows


def write(path: Path = JSONL) -> Path:
    rows = conversations()
    random.Random(0).shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def plain_tokenizer():
    """One token per character, with the chat template of the notebooks' own tokenizer, as a plain
    `PreTrainedTokenizerFast` that returns `token_type_ids` (no `model_input_names` given)."""
    from transformers import PreTrainedTokenizerFast

    from helpers.models.char_tokenizer import END, PAD, ROLE_TOKENS, UNK, build_char_tokenizer

    chars = build_char_tokenizer()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=chars.backend_tokenizer,
        pad_token=PAD,
        unk_token=UNK,
        eos_token=END,
        additional_special_tokens=list(ROLE_TOKENS.values()),
    )
    tokenizer.chat_template = chars.chat_template
    assert "token_type_ids" in tokenizer("a"), "this tokenizer is meant to return token_type_ids"
    return tokenizer


def pretrained_looking(arch: str = "llama", steps: int = 80, seed: int = 0) -> Path:
    """A tiny `arch` ("llama" or "gpt-oss") with `plain_tokenizer()`, after `steps` AdamW steps on whole
    conversations about WARMUP_ELEMENTS (none of the data set's elements); saved once in the gallery's cache
    (about a minute on a busy CPU), its folder returned."""
    from helpers.paths import cache_dir

    folder = cache_dir("tests_chat_facts", f"{arch}-warmup{steps}-s{seed}")
    if (folder / "model.safetensors").is_file() and (folder / "tokenizer_config.json").is_file():
        return folder
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM

    tokenizer = plain_tokenizer()
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        max_position_embeddings=256,
        tie_word_embeddings=arch == "llama",
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    if arch == "llama":
        model = LlamaForCausalLM(
            LlamaConfig(intermediate_size=256, num_attention_heads=4, num_key_value_heads=4, **common)
        )
    elif arch == "gpt-oss":
        model = GptOssForCausalLM(
            GptOssConfig(
                intermediate_size=64,
                head_dim=16,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_local_experts=4,
                num_experts_per_tok=2,
                sliding_window=8,
                rope_scaling=None,
                router_aux_loss_coef=0.02,
                attn_implementation="eager",
                **common,
            )
        )
    else:
        raise ValueError(f"arch={arch!r}: 'llama' or 'gpt-oss'")
    texts = [
        tokenizer.apply_chat_template(r["messages"], tokenize=False) for r in conversations(WARMUP_ELEMENTS)
    ]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest on a shared machine
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        rng = random.Random(seed)
        model.train()
        for _ in range(steps):
            batch = tokenizer(
                rng.sample(texts, 16), return_tensors="pt", padding=True, add_special_tokens=False
            )
            labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            loss = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels
            ).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    finally:
        torch.set_num_threads(threads)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)  # the weights last: a folder that has them is complete
    return folder


if __name__ == "__main__":
    print(f"wrote {len(conversations())} conversations to {write()}")
