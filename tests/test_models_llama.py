"""The offline stand-in for a Llama 3.2 Instruct folder: what a real one brings, loaded as a real one is."""

import pytest

from helpers.models.llama import SPECIAL_TOKENS, build_llama_checkpoint, llama32_chat_template


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_llama_checkpoint(tmp_path_factory.mktemp("llama") / "Llama-3.2-tiny-Instruct")


def test_loads_like_a_hub_checkpoint(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.rope_scaling["rope_type"] == "llama3" and model.config.tie_word_embeddings
    assert model.config.num_key_value_heads < model.config.num_attention_heads      # grouped-query attention
    assert tokenizer.pad_token is None and tokenizer.eos_token == "<|eot_id|>"      # as Llama 3.2 ships
    assert all(tokenizer.convert_tokens_to_ids(t) != tokenizer.unk_token_id for t in SPECIAL_TOKENS)
    text = "def reverse(text):\n    return text[::-1]  # é"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text and len(ids) < len(text)                   # byte-level BPE merges


def test_llama32_template_and_what_trl_makes_of_it(folder):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == llama32_chat_template()
    chat = [{"role": "user", "content": "reverse: abc"}, {"role": "assistant", "content": "cba"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\ncba<|eot_id|>")
    # No {% generation %} markers, and TRL cannot add them: assistant_only_loss=True fails on this template,
    # which is why notebook 05 trains on prompt-completion pairs.
    assert not has_generation_markers(tokenizer.chat_template)
    with pytest.raises(ValueError, match="not training-compatible"):
        get_training_chat_template(tokenizer)


def test_bad_shapes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="grouped-query"):
        build_llama_checkpoint(tmp_path / "x", hidden_size=64, heads=4, kv_heads=3)
