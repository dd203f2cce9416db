"""Each notebook's "scale up" run: the one parameter set that its text and the tests share.

The gallery promises that every lesson runs at full size by changing parameters only. That promise is only
as good as the commands we print, so they are written once, in each notebook's record of
`helpers.gallery.catalog`: the notebooks' "Scaling up" sections are
checked against these sets (tests/test_scale_up.py), the README's gallery table links each of those sections
under the set's `where`, and the same test executes every notebook with them, on local stand-ins of the real
data and with a step cap.

    python -m helpers.gallery --scale-up          # every notebook's command, as the notebooks print it
    python -m helpers.gallery --scale-up 04       # one notebook's
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from helpers.gallery.catalog import CATALOG, ScaleUp

# Each notebook's set lives in its catalog record; this is the view the commands and their tests read.
SCALE_UPS: dict[str, ScaleUp] = {nb.stem: nb.scale_up for nb in CATALOG if nb.scale_up}


def _cli_value(value: Any) -> str:
    """A value as papermill's `-p` reads it back (True/False/None, ints and floats are converted)."""
    if isinstance(value, float):
        return re.sub(r"e([+-])0*(\d)", lambda m: "e" + m[1].replace("+", "") + m[2], repr(value))  # 2e-5
    return str(value)


def parameter_args(parameters: dict[str, Any]) -> list[str]:
    """papermill arguments for `parameters`: `-p NAME VALUE`, or `-y 'NAME: [...]'` for lists and dicts.

    `-p` gives a list as a string ("[0.5, 1.0, 2.0]"), so lists and dicts travel as YAML, which papermill
    parses.
    """
    import json

    args: list[str] = []
    for name, value in parameters.items():
        if isinstance(value, (list, tuple, dict)):
            args += ["-y", f"{name}: {json.dumps(value)}"]
        else:
            args += ["-p", name, _cli_value(value)]
    return args


def _quote(args: list[str]) -> list[str]:
    return [shlex.quote(a) for a in args]


def inline(notebook: str) -> str:
    """The parameters alone, on one line, as a user types them after `papermill IN OUT`."""
    return " ".join(_quote(parameter_args(SCALE_UPS[notebook].parameters)))


def command(notebook: str, width: int = 110) -> str:
    """The papermill command the notebook's "Scaling up" section prints, wrapped with backslashes."""
    words = ["papermill", f"notebooks/{notebook}.ipynb", "out.ipynb"]
    pairs = [" ".join(_quote(parameter_args({k: v}))) for k, v in SCALE_UPS[notebook].parameters.items()]
    lines, line = [], " ".join(words)
    for pair in pairs:
        if len(line) + 1 + len(pair) + 2 > width:
            lines.append(line + " \\")
            line = "    " + pair
        else:
            line += " " + pair
    lines.append(line)
    return "\n".join(lines)


def _resolve_type(value: str) -> Any:
    """papermill's `-p` conversion (its cli._resolve_type, 2.7): True/False/None, int, float, else text."""
    if value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[value]
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def parse_parameters(text: str) -> dict[str, Any]:
    """What a papermill command line (or a README fragment of one) passes, read as papermill reads it."""
    import yaml

    words = shlex.split(text.replace("\\\n", " "))
    found: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("-p", "--parameters"):
            found[words[i + 1]] = _resolve_type(words[i + 2])
            i += 3
        elif word in ("-r", "--parameters_raw"):
            found[words[i + 1]] = words[i + 2]
            i += 3
        elif word in ("-y", "--parameters_yaml"):
            found.update(yaml.safe_load(words[i + 1]))
            i += 2
        else:
            i += 1
    return found


def cli_parameters(notebook: str) -> dict[str, Any]:
    """What a user who types the printed command really passes to the notebook (parsed back by papermill)."""
    return parse_parameters(inline(notebook))
