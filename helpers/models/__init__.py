"""Saved model folders built offline, in the layouts real checkpoints use (no download)."""
