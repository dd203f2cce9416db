"""Notebook 01's data: scikit-learn's handwritten digits, or the user's table of the same kind, as arrays.

scikit-learn ships the UCI digits (1,797 images of 8x8 pixels, 10 classes) inside the package, so the lesson
downloads nothing. A user's own data is a CSV of the same shape: one row per example, any number of numeric
feature columns and an integer `label` column. `data_path` names that CSV, or a folder holding it as
`digits.csv`. The features come back scaled to [0, 1] (divided by the largest value), so the same learning
rate suits both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CSV_NAME = "digits.csv"


def csv_path(data_path: str | Path) -> Path:
    """The CSV that `data_path` names: the file itself, or `digits.csv` in the folder."""
    path = Path(data_path)
    if path.is_dir():
        path = path / CSV_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"data_path={str(data_path)!r} has no {CSV_NAME} and is no CSV file: give a CSV of numeric "
            f"feature columns and an integer 'label' column, or a folder holding it as {CSV_NAME}, or set "
            "data_path=None for scikit-learn's digits.")
    return path


def load_digits_table(data_path: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels): float32 features scaled to [0, 1] and int64 labels, one row per example.

    `data_path=None`: scikit-learn's digits. Otherwise the CSV `data_path` names (see `csv_path`).
    """
    if data_path is None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        features, labels = digits.data.astype(np.float32), digits.target.astype(np.int64)
    else:
        import pandas as pd

        path = csv_path(data_path)
        frame = pd.read_csv(path)
        if "label" not in frame.columns:
            raise ValueError(f"{path} has no 'label' column; its columns are {list(frame.columns)[:8]}...")
        labels = frame.pop("label").to_numpy(np.int64)
        features = frame.to_numpy(np.float32)
    return features / max(float(features.max()), 1.0), labels
