"""helpers.plain: the one conversion of computed values to plain Python data, and its contract."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers.plain import plain


def test_numpy_and_torch_scalars_become_python_scalars():
    torch = pytest.importorskip("torch")
    for value, expected in [(np.float32(0.5), 0.5), (np.int64(3), 3), (np.bool_(True), True),
                            (np.array(2.5), 2.5), (torch.tensor(7), 7), (torch.tensor(True), True)]:
        got = plain(value)
        assert got == expected and type(got) is type(expected), (value, got)


def test_arrays_tuples_and_series_become_lists_and_a_one_element_array_stays_a_list():
    torch = pytest.importorskip("torch")
    assert plain(np.array([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    assert plain((1, np.float64(2.0), "a")) == [1, 2.0, "a"]
    assert plain(pd.Series([0.25, 0.5])) == [0.25, 0.5]
    assert plain(torch.tensor([1.5])) == [1.5]
    assert plain(np.array([4])) == [4]


def test_mappings_get_the_keys_json_writes_and_paths_become_strings():
    value = {"a": (1, 2), 2: Path("/x/y"), True: None, None: np.float32(1.0), np.int64(5): 0.5}
    assert plain(value) == {"a": [1, 2], "2": "/x/y", "true": None, "null": 1.0, "5": 0.5}
    assert plain(value) == json.loads(json.dumps(plain(value)))
    assert plain({"k": (1, 2), 3: "x"}) == json.loads(json.dumps({"k": (1, 2), 3: "x"}))


def test_non_finite_floats_stay_floats_unless_asked_for_text():
    assert math.isnan(plain(float("nan"))) and plain([float("inf")]) == [math.inf]
    assert plain(np.float64("nan"), nonfinite="str") == "nan"
    assert plain([float("-inf"), 1.0], nonfinite="str") == ["-inf", 1.0]
    with pytest.raises(ValueError, match="nonfinite"):
        plain(1.0, nonfinite="drop")


def test_unknown_types_raise_unless_a_default_converts_them():
    with pytest.raises(TypeError, match="object"):
        plain({"x": object()})
    assert plain({"s": {1, 2}}, default=sorted) == {"s": [1, 2]}
    assert plain(b"ab", default=bytes.decode) == "ab"


def test_scalar_takes_one_value_and_sends_containers_to_default():
    torch = pytest.importorskip("torch")
    assert plain(np.array([0.75]), scalar=True) == 0.75
    assert plain(torch.tensor([2]), scalar=True) == 2
    with pytest.raises(TypeError, match="not a number or a string"):
        plain([1, 2], scalar=True)
    with pytest.raises(TypeError, match="not a number or a string"):
        plain(np.array([1, 2]), scalar=True)
    assert plain((1, 2), scalar=True, default=str) == "(1, 2)"
    assert plain({"a": 1}, scalar=True, default=lambda v: None) is None
