"""A saved Hugging Face model folder shaped like Llama 3.2 Instruct, built offline.

Why: the "scale up" path of a fine-tuning notebook loads a real checkpoint with `AutoModelForCausalLM` and
`AutoTokenizer` from a folder (`-p model_name /models/Llama-3.2-1B-Instruct`), and a test of that path must
load a folder that behaves the same, without a download. What makes a real Llama 3 checkpoint different from
the notebooks' tiny character models, and is reproduced here:

* a byte-level BPE tokenizer (trained here with the `tokenizers` library on the chat data and some Python
  source), Llama 3's special tokens (`<|begin_of_text|>`, `<|start_header_id|>`, `<|eot_id|>`, ...), the
  end of a turn as end-of-sequence, and **no pad token**, as Llama 3.2 ships;
* Llama 3.2's own chat template (the copy TRL keeps), which has no `{% generation %}` markers, and which TRL
  cannot patch for `assistant_only_loss=True` (it raises): a notebook must train on prompt-completion pairs
  instead, which work with any template;
* the architecture's options: grouped-query attention, llama3 RoPE scaling, tied embeddings, safetensors.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from helpers.data.builds import reuse_or_build
from helpers.paths import cache_dir

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|finetune_right_pad_id|>", "<|python_tag|>", "<|eom_id|>"]
_FORMAT_VERSION = 1


def llama32_chat_template() -> str:
    """Llama 3.2's chat template, as TRL ships it (TRL recognises exactly this text)."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / "llama3_2.jinja").read_text()


def _training_text(chat_rows: list[dict], limit: int = 150_000) -> list[str]:
    """The tokenizer's training text: the conversations, then Python source up to `limit` bytes."""
    texts = [m["content"] for row in chat_rows for m in row["messages"]]
    stdlib, size = Path(sysconfig.get_paths()["stdlib"]), sum(map(len, texts))
    for path in sorted(stdlib.glob("*.py")):
        if size >= limit:
            break
        text = path.read_text(errors="replace")
        texts.append(text)
        size += len(text)
    return texts


def _tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|begin_of_text|>",
                                        eos_token="<|eot_id|>",  # the end of a turn, as in Llama 3.2 Instruct
                                        model_input_names=["input_ids", "attention_mask"])
    tokenizer.chat_template = llama32_chat_template()
    return tokenizer


def build_llama_checkpoint(root: str | Path | None = None, *, hidden_size: int = 64, layers: int = 2,
                           heads: int = 4, kv_heads: int = 2, vocab_size: int = 2048, seed: int = 0,
                           chat_rows: list[dict] | None = None) -> Path:
    """Write (or reuse) the folder and return it: `config.json`, `model.safetensors`, the tokenizer files.

    `chat_rows` (the notebook's own conversations) join the tokenizer's training text; the default uses the
    gallery's built-in `reverse` task. Same arguments, same folder contents.
    """
    if hidden_size % heads or heads % kv_heads:
        raise ValueError(f"hidden_size={hidden_size} must divide by heads={heads}, and heads by "
                         f"kv_heads={kv_heads} (grouped-query attention).")
    if vocab_size < 512:
        raise ValueError(f"vocab_size={vocab_size}: a byte-level BPE needs at least 256 bytes plus merges; "
                         "use 512 or more.")
    if chat_rows is None:
        from helpers.data.sft_tasks import build_sft_tasks, validate_sft_jsonl

        chat_rows = validate_sft_jsonl(build_sft_tasks("reverse", n_train=400, n_test=10, seed=seed)["train"])
    args = {"hidden_size": hidden_size, "layers": layers, "heads": heads, "kv_heads": kv_heads,
            "vocab_size": vocab_size, "seed": seed, "chat_rows": len(chat_rows), "version": _FORMAT_VERSION}
    folder = Path(root) if root is not None else cache_dir(
        "llama_checkpoint", f"h{hidden_size}-l{layers}-v{vocab_size}-s{seed}-n{len(chat_rows)}")
    files = [folder / name for name in ("config.json", "model.safetensors", "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json",
                                        "generation_config.json", "chat_template.jinja")]

    def write() -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        tokenizer = _tokenizer(_training_text(chat_rows), vocab_size)
        config = LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
            max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
            rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eom_id|>",
                                                                         "<|eot_id|>")])
        torch.manual_seed(seed)
        LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)

    reuse_or_build(folder, args, [f for f in files if f.name != "chat_template.jinja"], write)
    return folder
