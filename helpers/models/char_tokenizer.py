"""A character-level chat tokenizer built offline, for models trained from scratch with no download.

Why: a real fine-tuning run loads the tokenizer that came with the model (Llama 3.2's, for example), but a
notebook that must run with no internet needs one it can build itself. One token per character is the
simplest tokenizer that can spell any answer exactly, which the exact-match tasks of
``helpers.data.sft_tasks`` need, and its vocabulary is a hundred entries, so the embedding stays tiny.

It is an ordinary ``transformers.PreTrainedTokenizerFast`` (built with the ``tokenizers`` library), with a
chat template, so TRL's ``SFTTrainer``, ``apply_chat_template``, ``save_pretrained`` and
``AutoTokenizer.from_pretrained`` all treat it like a hub tokenizer. The template marks the assistant's reply,
end-of-turn token included, with ``{% generation %}``, so ``assistant_only_loss=True`` trains only on answers
and the model learns to stop.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, UNK, END = "<pad>", "<unk>", "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|assistant|>{% generation %}{{ message['content'] }}<|end|>{% endgeneration %}"
    "{% else %}<|{{ message['role'] }}|>{{ message['content'] }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_char_tokenizer(extra_chars: str = "") -> PreTrainedTokenizerFast:
    """A tokenizer with one token per printable ASCII character (plus `extra_chars`) and chat special tokens.

    Characters outside the vocabulary become ``<unk>``. ``<|end|>`` ends an assistant turn and is the
    end-of-sequence token, so generation stops there; ``<pad>`` pads batches.
    """
    specials = [PAD, UNK, END, *ROLE_TOKENS.values()]
    chars = sorted(set(string.printable) - set("\t\n\r\x0b\x0c") | set(extra_chars))
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    # BPE with no merges splits a string into single characters and keeps character offsets, which
    # `return_assistant_tokens_mask` needs; Fuse() joins characters back without spaces when decoding.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, unk_token=UNK, eos_token=END,
        additional_special_tokens=list(ROLE_TOKENS.values()), padding_side="left",
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids: Llama takes none
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
