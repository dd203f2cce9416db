"""Plain Python values from what notebooks compute: what JSON, MLflow and a printed table take as they are.

One contract for every writer of results and parameters (the metrics a notebook records, the results it
checks against its reference runs, the parameters compared with a reference's, a build's manifest, the
numbers MLflow logs):

* numpy and torch scalars (0-d arrays and tensors included) become `bool`, `int`, `float` or `str`;
* arrays, tensors and pandas Series (anything with `tolist()`), lists and tuples become lists of plain
  values: a one-element array is a list of one;
* mappings become dicts whose keys are strings as JSON writes them (1 -> "1", True -> "true", None -> "null");
* paths (`os.PathLike`) become strings;
* a non-finite float stays a float (nan, inf, as `json.dumps` writes them), or with `nonfinite="str"` becomes
  its text ("nan", "inf", "-inf"), for a reader that takes no NaN;
* anything else raises TypeError, or becomes what `default` makes of it (`default=str`: its text), as with
  `json.dumps`'s `default`.

`scalar=True` asks for one value: a numpy or torch value of one element gives it (`.item()`), and a list,
mapping or larger array is treated as an unknown type. What `plain` returns reads back from JSON as it is
(`json.loads(json.dumps(plain(v))) == plain(v)`, nan aside). Standard library only: ranks import it too.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

NONFINITE = ("keep", "str")


def plain(value: Any, *, nonfinite: Literal["keep", "str"] = "keep",
          default: Callable[[Any], Any] | None = None, scalar: bool = False) -> Any:
    """`value` as plain Python data (see the module's docstring for the contract)."""
    if nonfinite not in NONFINITE:
        raise ValueError(f"nonfinite={nonfinite!r}: use 'keep' (nan stays a float) or 'str' (nan becomes "
                         "'nan')")
    return _plain(value, nonfinite, default, scalar)


def _plain(value: Any, nonfinite: str, default: Callable[[Any], Any] | None, scalar: bool) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return str(value) if nonfinite == "str" and not math.isfinite(value) else float(value)
    if isinstance(value, os.PathLike):
        return str(os.fspath(value))
    if scalar and callable(getattr(value, "item", None)):
        try:
            return _plain(value.item(), nonfinite, default, scalar)
        except (ValueError, RuntimeError):  # more than one element: not a scalar
            return _unknown(value, nonfinite, default, scalar)
    if callable(getattr(value, "tolist", None)):
        converted = value.tolist()
        if scalar and isinstance(converted, list):
            return _unknown(value, nonfinite, default, scalar)
        return _plain(converted, nonfinite, default, scalar)
    if callable(getattr(value, "item", None)):
        return _plain(value.item(), nonfinite, default, scalar)
    if scalar:
        return _unknown(value, nonfinite, default, scalar)
    if isinstance(value, Mapping):
        return {_key(k): _plain(v, nonfinite, default, scalar) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [_plain(v, nonfinite, default, scalar) for v in value]
    return _unknown(value, nonfinite, default, scalar)


def _unknown(value: Any, nonfinite: str, default: Callable[[Any], Any] | None, scalar: bool) -> Any:
    if default is None:
        wanted = "a number or a string" if scalar else "a number, a string, or a list or dict of them"
        raise TypeError(f"{value!r} ({type(value).__name__}) is not {wanted}")
    return _plain(default(value), nonfinite, None, False)


def _key(key: Any) -> str:
    """A mapping key as JSON writes it."""
    if callable(getattr(key, "tolist", None)):  # a numpy scalar
        key = key.tolist()
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)
    raise TypeError(f"mapping key {key!r} ({type(key).__name__}) is not a string or a number")
