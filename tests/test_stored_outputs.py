"""What a reader sees in a stored notebook: checked on every notebook in notebooks/, present and future.

Outputs are stored from a real run, so whatever the run printed is what the reader gets. These rules keep
out what a reader cannot use: the machine's own paths and addresses, tracebacks nobody explains, warnings
nobody can act on, advertisements, terminal colour codes, notes about how the lesson was developed, and
notebooks too big to open comfortably.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.paths import NOTEBOOKS_DIR, ROOT

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
MAX_BYTES = 500_000
# A cell may show a traceback on purpose when the lesson is about the failure; its markdown then explains it.
TRACEBACK_TAG = "shows-traceback"

MACHINE_PATHS = re.compile(
    r"(?<![\w.~-])/(?:home|root|work|tmp|Users|opt|var|usr|mnt|private|srv|scratch|run)/"
)
IP_ADDRESS = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.])")
ANSI = re.compile(r"\x1b\[")
WARNING = re.compile(r"\b[A-Z]\w*Warning\b|\[WARNING\]|\bWARNING\b")
ADVERT = re.compile(r"💡|\bTip:|try installing|litlogger|Lightning Experiments platform", re.I)
DEVELOPMENT = re.compile(
    r"\bissue #?\d+\b|when this lesson was written|written up|we hit this|in our runs", re.I
)


def _outputs(path: Path):
    """(cell index, cell, output, text) for every output of every code cell."""
    nb = nbformat.read(str(path), as_version=4)
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = out.get("text", "")
            elif out.get("output_type") == "error":
                text = "\n".join(out.get("traceback", []))
            else:
                data = out.get("data", {})
                text = "\n".join(str(data.get(k, "")) for k in ("text/plain", "text/html", "text/markdown"))
            yield index, cell, out, text


def _ip_like(text: str) -> list[str]:
    return [m for m in IP_ADDRESS.findall(text) if all(int(part) <= 255 for part in m.split("."))]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_size(path):
    assert path.stat().st_size < MAX_BYTES, (
        f"{path.name} is {path.stat().st_size / 1e3:.0f} KB: shrink its figures (dpi, size) below "
        f"{MAX_BYTES // 1000} KB"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_machine_specifics(path):
    own = [str(ROOT), sys.prefix, str(Path.home())]
    for index, _, _, text in _outputs(path):
        found = MACHINE_PATHS.search(text)
        shown = text[found.start():found.start() + 60] if found else ""
        assert not found, f"cell {index} shows a path of this machine: {shown!r}"
        for folder in own:
            assert folder not in text, f"cell {index} shows {folder}"
        assert not _ip_like(text), f"cell {index} shows an IP address: {_ip_like(text)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_errors_or_unexplained_tracebacks(path):
    for index, cell, out, text in _outputs(path):
        assert out.get("output_type") != "error", f"cell {index} was stored with an error"
        if "Traceback (most recent call last)" in text:
            assert TRACEBACK_TAG in cell.metadata.get("tags", []), (
                f"cell {index} shows a traceback: fix its cause, or tag the cell {TRACEBACK_TAG!r} "
                "and explain it"
            )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_warnings_adverts_or_colour_codes(path):
    for index, _, _, text in _outputs(path):
        assert not ANSI.search(text), f"cell {index} holds terminal colour codes"
        assert not ADVERT.search(text), f"cell {index} holds an advert: {ADVERT.search(text).group(0)!r}"
        found = WARNING.search(text)
        assert not found, (
            f"cell {index} shows a warning ({found.group(0)}): silence it at its source, saying why"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_text_speaks_of_the_lesson(path):
    nb = nbformat.read(str(path), as_version=4)
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            found = DEVELOPMENT.search(cell.source)
            assert not found, f"cell {index} speaks of how the lesson was made: {found.group(0)!r}"


def test_the_rules_catch_what_they_name(tmp_path):
    """Each rule, on a notebook that breaks it."""
    bad = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=(
        f"{ROOT}/x.py:3: UserWarning: careful\n\x1b[33mraylet\x1b[0m at 10.0.3.7\n"
        "💡 Tip: try installing litlogger\n"
        "Traceback (most recent call last):\n"))]
    bad.cells = [nbformat.v4.new_markdown_cell("As we saw in issue 4, ..."), cell]
    path = tmp_path / "99_bad.ipynb"
    nbformat.write(bad, str(path))
    for rule in (test_no_machine_specifics, test_no_errors_or_unexplained_tracebacks,
                 test_no_warnings_adverts_or_colour_codes, test_text_speaks_of_the_lesson):
        with pytest.raises(AssertionError):
            rule(path)
    assert _ip_like("torch 2.14.1 on [127.0.0.1]:2965") == ["127.0.0.1"] and not _ip_like("version 2.14.1")
