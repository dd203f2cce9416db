"""A byte-level text corpus that exists on every machine: the Python standard library's own source.

A language model needs text, and nothing may be downloaded. Every Python installation carries a few
megabytes of real, varied, human-written text: the `.py` files of its standard library (code, comments,
docstrings). Read as bytes, they give a byte-level corpus (vocabulary 256, no tokenizer to ship) on
which a small model's learning is easy to measure against a unigram baseline.

The builder writes what language-model pipelines commonly read: flat token files (`train.bin`,
`val.bin`, one uint8 token per byte, read with `numpy.fromfile` or `numpy.memmap`) plus a
`manifest.json` naming the source files and the build arguments. `data_path` swaps in a user's corpus
(one text file, or a folder of them) through the same code path. `global_batch` draws the training windows
from those files the way both lessons that use them (04, 10) do: as a function of the step alone.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from helpers.data.builds import digest, reuse_or_build
from helpers.paths import cache_dir

if TYPE_CHECKING:
    import torch

VOCAB_SIZE = 256  # byte-level tokens: token id == byte value
# Test suites, installed packages, and the codec tables of `encodings` (machine-generated, not prose).
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings"}
# The smallest corpus the split accepts: each part must hold a few training windows.
MIN_BYTES = 4096


@dataclass(frozen=True)
class TextCorpus:
    """Where the built corpus lives, and what it holds."""

    train_path: Path
    val_path: Path
    manifest: dict[str, Any]

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """(train, val) token arrays (uint8; one token per byte)."""
        return (np.fromfile(self.train_path, dtype=np.uint8), np.fromfile(self.val_path, dtype=np.uint8))

    def summary(self, sample_bytes: int = 240) -> str:
        """What a lesson prints about its corpus: how many files and bytes, then the first bytes of the
        training text (decoded, a broken character replaced)."""
        with self.train_path.open("rb") as f:
            sample = f.read(sample_bytes).decode("utf-8", errors="replace")
        manifest = self.manifest
        return (f"{len(manifest['files'])} source files: {manifest['train_bytes']:,} training bytes, "
                f"{manifest['val_bytes']:,} validation bytes\n{sample}")


def stdlib_sources() -> list[Path]:
    """The standard library's .py files (its test suites and installed packages left out), sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py")
             if p.is_file() and not (_SKIP_DIRS & set(p.relative_to(root).parts))]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _user_sources(data_path: str | Path) -> list[Path]:
    path = Path(data_path).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted((p for p in path.rglob("*") if p.is_file() and not any(
            part.startswith(".") or part == "__pycache__" for part in p.relative_to(path).parts)),
            key=lambda p: p.relative_to(path).as_posix())
        if not files:
            raise ValueError(f"data_path={str(data_path)!r} is an empty folder: put text files in it, "
                             "or pass the path of one text file.")
        return files
    raise FileNotFoundError(f"data_path={str(data_path)!r} does not exist: pass a text file, a folder of "
                            "text files, or None for the built-in corpus (the Python standard library's "
                            "source).")


def _fingerprint(files: list[Path]) -> list[list[Any]]:
    return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def build_text_corpus(data_path: str | Path | None = None, *, seed: int = 0, max_bytes: int = 2_000_000,
                      val_fraction: float = 0.1, root: str | Path | None = None) -> TextCorpus:
    """Build (or reuse) the byte-level corpus and its train/validation split.

    Files are shuffled with `seed` and taken whole until `max_bytes` (the built-in corpus) or all of them
    (a user's `data_path`, truncated at `max_bytes` if larger); their bytes are concatenated, and the last
    `val_fraction` becomes the validation split, so validation text comes mostly from files never trained on.
    A build with identical arguments and unchanged source files is reused, not rewritten.
    Raises a ValueError/FileNotFoundError saying what to change, before writing anything.
    """
    if not 0.0 < val_fraction < 0.5:
        raise ValueError(f"val_fraction={val_fraction!r} must be between 0 and 0.5 (e.g. 0.1).")
    if not isinstance(max_bytes, int) or max_bytes < MIN_BYTES:
        raise ValueError(f"max_bytes={max_bytes!r} must be an int of at least {MIN_BYTES}.")
    files = stdlib_sources() if data_path is None else _user_sources(data_path)
    args = {"source": "python-stdlib" if data_path is None else str(Path(data_path).expanduser().resolve()),
            "seed": seed, "max_bytes": max_bytes, "val_fraction": val_fraction, "files": _fingerprint(files)}
    total = min(max_bytes, sum(size for _, size, _ in args["files"]))
    if total < MIN_BYTES:
        raise ValueError(f"the corpus at {args['source']!r} holds {total} bytes; at least {MIN_BYTES} are "
                         "needed for a train/validation split. Point data_path at more text.")
    key = digest(args, 16)
    out = Path(root) if root is not None else cache_dir("text_corpus", key)
    train_path, val_path = out / "train.bin", out / "val.bin"

    def write() -> dict[str, Any]:
        order = list(files)
        random.Random(seed).shuffle(order)
        chosen, chunks, total = [], [], 0
        for path in order:
            if total >= max_bytes:
                break
            data = path.read_bytes()[: max_bytes - total]
            if data:
                chosen.append(str(path))
                chunks.append(data)
                total += len(data)
        corpus = b"".join(chunks)
        cut = int(len(corpus) * (1 - val_fraction))
        train_path.write_bytes(corpus[:cut])
        val_path.write_bytes(corpus[cut:])
        return {"files": chosen, "train_bytes": cut, "val_bytes": len(corpus) - cut, "vocab_size": VOCAB_SIZE,
                "sha256": hashlib.sha256(corpus).hexdigest()}

    build = reuse_or_build(out, args, [train_path, val_path], write)
    return TextCorpus(train_path, val_path, build.manifest)


def unigram_bits_per_byte(train: np.ndarray, val: np.ndarray) -> float:
    """Cross-entropy (bits per byte) of `val` under the byte frequencies of `train` (add-one smoothed).

    The baseline a language model must beat: what knowing only how common each byte is gives.
    """
    counts = np.bincount(train, minlength=VOCAB_SIZE).astype(np.float64) + 1.0
    log_p = np.log2(counts / counts.sum())
    return float(-log_p[val].mean())


def global_batch(tokens: np.ndarray, step: int, cfg: Mapping[str, Any]) -> torch.Tensor:
    """The global batch of step `step`: `cfg["batch_size"]` windows of `cfg["context"] + 1` bytes of `tokens`
    (int64, one row each), at offsets drawn from a generator seeded with `(cfg["seed"], step)`.

    Why a function of the step alone: no data-loader state to save in a checkpoint; the same global batch
    for any number of ranks (rank r of N takes rows r*B/N to (r+1)*B/N); and a run resumed from step s, on
    any world size, sees exactly the batches an uninterrupted run would have seen. Negative steps give
    windows of the validation split that training never draws (the lessons evaluate on steps -1, -2, ...).
    """
    import torch

    generator = torch.Generator().manual_seed(cfg["seed"] * 1_000_003 + step)
    starts = torch.randint(len(tokens) - cfg["context"] - 1, (cfg["batch_size"],), generator=generator)
    return torch.stack([torch.from_numpy(tokens[s:s + cfg["context"] + 1].astype(np.int64))
                        for s in starts.tolist()])
