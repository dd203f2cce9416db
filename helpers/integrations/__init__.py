"""Adapters to the lessons' frameworks: progress callbacks (Lightning, transformers), Axolotl's plugin."""
