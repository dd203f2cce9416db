"""helpers.data.digits: notebook 01's data, scikit-learn's digits or the user's CSV (a file or a folder)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from helpers.data.digits import load_digits_table


def test_the_built_in_digits_scaled_to_one():
    features, labels = load_digits_table(None)
    assert features.shape == (1797, 64) and features.dtype == np.float32
    assert labels.dtype == np.int64 and sorted(set(labels.tolist())) == list(range(10))
    assert features.min() == 0.0 and features.max() == 1.0


@pytest.mark.parametrize("given", ["file", "folder"])
def test_a_user_csv_as_a_file_or_in_a_folder(tmp_path, given):
    frame = pd.DataFrame({"a": [0, 5, 10], "b": [20, 0, 4], "label": [1, 0, 2]})
    frame.to_csv(tmp_path / "digits.csv", index=False)
    features, labels = load_digits_table(tmp_path / "digits.csv" if given == "file" else str(tmp_path))
    assert labels.tolist() == [1, 0, 2]
    np.testing.assert_allclose(features, np.array([[0, 1], [0.25, 0], [0.5, 0.2]], np.float32))


def test_refusals(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no digits.csv and is no CSV file"):
        load_digits_table(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="has no digits.csv"):
        load_digits_table(tmp_path)
    pd.DataFrame({"a": [1], "y": [0]}).to_csv(tmp_path / "mine.csv", index=False)
    with pytest.raises(ValueError, match="has no 'label' column"):
        load_digits_table(tmp_path / "mine.csv")
