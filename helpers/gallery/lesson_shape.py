"""How a lesson reads: the code a reader studies before its Checks, its largest cell, and where the
technique's own constructs appear. `tests/test_lesson_shape.py` holds every notebook to the budgets below;
`python -m helpers.gallery.lesson_shape` prints the table.

What counts: non-blank lines of code cells (comment lines too: a reader reads them), except the `parameters`
cell. "Before Checks" is every code cell above the first markdown heading that starts with "Checks". A
private name of another library is an attribute that starts with one underscore (`._reset_state`),
`os._exit` aside (the standard library's documented way to end a process without clean-up, which the
crash demonstrations need).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from helpers.gallery.catalog import CATALOG

# Non-blank code lines before the Checks heading, the parameters cell aside, and the framework's own
# constructs each lesson must show before its Checks (what a reader came to see),
# both from each notebook's catalog record.
BUDGETS = {nb.number: nb.budget for nb in CATALOG if nb.budget is not None}
MAX_CELL_LINES = 60
ANCHORS = {nb.number: nb.anchors for nb in CATALOG if nb.anchors}
PRIVATE = re.compile(r"\b[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*\.(_[A-Za-z]\w*)")
ALLOWED_PRIVATE = {"os._exit"}
CHECKS_HEADING = re.compile(r"^#+\s*Checks\b", re.M)


@dataclass
class Shape:
    notebook: str
    code_lines: int            # every code cell but the parameters cell
    before_checks: int         # the part a reader studies
    largest_cell: int
    largest_cell_index: int
    before_anchor: int | None  # code lines before the first anchor construct appears
    private_names: list[str]
    missing_anchors: list[str]
    has_checks: bool

    @property
    def number(self) -> str:
        return self.notebook[:2]


def _lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip())


def private_names(source: str) -> list[str]:
    found = []
    for match in PRIVATE.finditer(source):
        whole = match.group(0)
        dunder = match.group(1).startswith("__")
        if whole not in ALLOWED_PRIVATE and not whole.startswith("self.") and not dunder:
            found.append(whole)
    return found


def shape(path: str | Path) -> Shape:
    path = Path(path)
    cells = nbformat.read(str(path), as_version=4).cells
    number = path.stem[:2]
    anchors = ANCHORS.get(number, ())
    code = before = largest = 0
    largest_index = -1
    before_anchor = None
    checks = False
    private: list[str] = []
    seen: set[str] = set()
    for index, cell in enumerate(cells):
        if cell.cell_type == "markdown":
            checks = checks or bool(CHECKS_HEADING.search(cell.source))
            continue
        if cell.cell_type != "code" or "parameters" in cell.metadata.get("tags", []):
            continue
        n = _lines(cell.source)
        code += n
        if n > largest:
            largest, largest_index = n, index
        if checks:
            continue
        if before_anchor is None and anchors and any(a in cell.source for a in anchors):
            lines = cell.source.splitlines()
            first = min(i for i, line in enumerate(lines) if any(a in line for a in anchors))
            before_anchor = before + _lines("\n".join(lines[:first]))
        before += n
        private += private_names(cell.source)
        seen |= {a for a in anchors if a in cell.source}
    return Shape(path.stem, code, before, largest, largest_index, before_anchor, sorted(set(private)),
                 [a for a in anchors if a not in seen], checks)


def table(paths: list[Path]) -> str:
    rows = ["| nb | code lines | before Checks (budget) | largest cell | before the technique starts "
            "| private names |",
            "|---|---:|---:|---:|---:|---|"]
    for p in paths:
        s = shape(p)
        budget = BUDGETS.get(s.number)
        rows.append(f"| {s.number} | {s.code_lines} | {s.before_checks}"
                    f"{f' ({budget})' if budget else ''} | {s.largest_cell} | "
                    f"{'' if s.before_anchor is None else s.before_anchor} | {', '.join(s.private_names)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    from helpers.paths import NOTEBOOKS_DIR

    names = sys.argv[1:]
    paths = sorted(p for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb")
                   if not names or any(p.stem.startswith(n) for n in names))
    print(table(paths))
