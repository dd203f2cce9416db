"""A table as MosaicML Streaming (MDS) shards: explicit column encodings, and an existing folder dealt with
on purpose (reused when it holds this very data, else replaced as a whole, never mixed with new shards)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from helpers.data.builds import read_json
from helpers.data.folders import replaced_folder
from helpers.data.movielens_format import MovieLensFormatError
from helpers.files import write_json

MANIFEST = "build.json"

_NUMPY_FOR_ENCODING = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
                       "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
                       "float16": np.float16, "float32": np.float32, "float64": np.float64}


@dataclass(frozen=True)
class MDSInfo:
    path: Path
    samples: int
    shards: list[dict[str, Any]]  # one row per shard: file, samples, bytes (on disk), raw_bytes
    reused: bool                  # True: an identical earlier conversion was kept
    replaced: bool                # True: an older, different conversion was deleted and rewritten

    @property
    def total_bytes(self) -> int:
        return sum(s["bytes"] for s in self.shards)

    def batches(self, batch_size: int) -> int:
        """The batches of an epoch over these samples at a global `batch_size` (the last one may be short)."""
        return -(-self.samples // batch_size)

    def index_summary(self) -> str:
        """The start of the `index.json` that `StreamingDataset` reads: its version and what the first shard's
        entry says (columns and their encodings, compression, hashes, samples, size limit, file)."""
        index = json.loads((self.path / "index.json").read_text())
        first = index["shards"][0]
        keys = ("column_names", "column_encodings", "compression", "hashes", "samples", "size_limit",
                "zip_data")
        shown = {k: first[k] for k in keys if k in first}
        return json.dumps({"version": index["version"], "shards[0]": shown}, indent=1)


def validate_for_mds(frame: pd.DataFrame, columns: dict[str, str]) -> None:
    """Check every column exists, has the encoding's type and no missing values, before writing anything."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise MovieLensFormatError(f"cannot write MDS: the table lacks column(s) {missing} "
                                   f"(it has {list(frame.columns)}).")
    for name, encoding in columns.items():
        kind = encoding.split(":")[0]
        values = frame[name]
        if kind in _NUMPY_FOR_ENCODING:
            if not (pd.api.types.is_integer_dtype(values) or pd.api.types.is_float_dtype(values)):
                raise MovieLensFormatError(f"cannot write MDS: column {name!r} ({values.dtype}) is not "
                                           f"numeric but its encoding is {encoding!r}.")
            if values.isna().any():
                raise MovieLensFormatError(f"cannot write MDS: column {name!r} has missing values.")
            if kind.startswith(("int", "uint")) and not pd.api.types.is_integer_dtype(values):
                raise MovieLensFormatError(f"cannot write MDS: column {name!r} holds {values.dtype} values "
                                           f"but its encoding {encoding!r} is an integer type: convert it "
                                           "first.")
        elif kind == "ndarray":
            first = values.iloc[0] if len(values) else None
            if not isinstance(first, np.ndarray):
                raise MovieLensFormatError(f"cannot write MDS: column {name!r} must hold numpy arrays "
                                           f"for encoding {encoding!r}, got {type(first).__name__}.")


def write_mds(frame: pd.DataFrame, out_dir: str | Path, columns: dict[str, str], *,
              compression: str | None = "zstd", hashes: tuple[str, ...] = ("sha1", "xxh64"),
              size_limit: int | str = "256kb", existing: Literal["reuse", "rebuild", "error"] = "reuse",
              ) -> MDSInfo:
    """Write `frame` as MDS shards with explicit column encodings; deal with an existing `out_dir` on purpose.

    `existing` says what to do with a directory already there:
    * "reuse": keep it if it holds this exact data written with these settings (same fingerprint in its
      `build.json`); replace it as a whole if it is an older conversion of ours with other data/settings;
    * "rebuild": always replace it;
    * "error": refuse if it exists with other contents.
    A directory this module did not write (no `build.json`) is never deleted: you are told to move it.
    Shards are written to a sibling temporary folder and renamed into place at the end, so a crash mid-way
    leaves the old directory intact and never a mix of old and new shards.
    """
    from streaming import MDSWriter

    validate_for_mds(frame, columns)  # before anything touches the disk
    out = Path(out_dir)
    settings = dict(columns=columns, compression=compression, hashes=list(hashes), size_limit=size_limit)
    fingerprint = _frame_digest(frame[list(columns)], settings)
    replaced = False
    if out.exists() and any(out.iterdir()):
        manifest = read_json(out / MANIFEST)
        ours = isinstance(manifest, dict) and "fingerprint" in manifest
        if not ours:
            raise FileExistsError(
                f"{out} exists and was not written by write_mds (no {MANIFEST}): it may hold another data "
                "set. Move or delete it yourself, or choose another output directory.")
        if existing == "reuse" and manifest["fingerprint"] == fingerprint and (out / "index.json").is_file():
            return _mds_info(out, reused=True, replaced=False)
        if existing == "error":
            raise FileExistsError(f"{out} holds an MDS conversion of other data or settings "
                                  f"(fingerprint {manifest['fingerprint'][:12]} != {fingerprint[:12]}): "
                                  "pass existing='rebuild' to replace it, or use another directory.")
        replaced = True

    with replaced_folder(out) as tmp:
        values = {name: _column_values(frame[name], enc) for name, enc in columns.items()}
        with MDSWriter(out=str(tmp), columns=columns, compression=compression, hashes=list(hashes),
                       size_limit=size_limit) as writer:
            for i in range(len(frame)):
                writer.write({name: col[i] for name, col in values.items()})
        write_json(tmp / MANIFEST, dict(settings, fingerprint=fingerprint, samples=len(frame)), indent=1,
                   sort_keys=True)
    return _mds_info(out, reused=False, replaced=replaced)


def _column_values(series: pd.Series, encoding: str) -> list:
    kind = encoding.split(":")[0]
    if kind in _NUMPY_FOR_ENCODING:
        return series.to_numpy(_NUMPY_FOR_ENCODING[kind]).tolist()
    if kind == "ndarray":
        parts = encoding.split(":")
        dtype = _NUMPY_FOR_ENCODING.get(parts[1]) if len(parts) > 1 else None
        return [np.ascontiguousarray(v, dtype=dtype) for v in series]
    return series.tolist()


def _mds_info(out: Path, reused: bool, replaced: bool) -> MDSInfo:
    index = json.loads((out / "index.json").read_text())
    shards = []
    for shard in index["shards"]:
        stored = shard.get("zip_data") or shard["raw_data"]
        shards.append({"file": stored["basename"], "samples": shard["samples"], "bytes": stored["bytes"],
                       "raw_bytes": shard["raw_data"]["bytes"]})
    return MDSInfo(out, sum(s["samples"] for s in shards), shards, reused=reused, replaced=replaced)


def _frame_digest(frame: pd.DataFrame, settings: dict) -> str:
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    h.update(str(len(frame)).encode())
    for name in frame.columns:
        h.update(name.encode())
        column = frame[name]
        if column.dtype == object:
            for v in column:
                h.update(np.ascontiguousarray(v).tobytes() if isinstance(v, np.ndarray) else repr(v).encode())
        else:
            h.update(column.to_numpy().tobytes())
    return h.hexdigest()

