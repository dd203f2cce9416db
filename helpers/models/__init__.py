"""Models more than one lesson uses (gpt: the byte-level GPT of 04 and 10), and saved model folders built
offline in the layouts real checkpoints use (gpt_oss: no download)."""
