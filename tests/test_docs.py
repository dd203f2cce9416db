"""README.md, data/README.md and docs/*.md state what is true now: no dates, no commit ids.

A figure with a date ("on 2026-12-02: 01 23 s ...") or a commit ("a clean clone of 37b902f took 18:04") is a
measurement of the past, stale the day it is written; history belongs to git, and current figures to what
the benchmarks print. This fails when the front page or a docs page carries either outside a fenced code
block, where commands and their output may hold anything.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support import NOTEBOOKS

ROOT = NOTEBOOKS.parent
PAGES = [ROOT / "README.md", ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
          r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?")
_YEAR = r"(?:19|20)\d\d"
_DAY = r"(?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?"
DATE = re.compile(
    rf"(?<![\w.-])(?:{_YEAR}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])"   # 2026-12-02
    rf"|{_YEAR}/(?:0[1-9]|1[0-2])/(?:0[1-9]|[12]\d|3[01])"                # 2026/12/02
    rf"|{_DAY}/(?:0?[1-9]|1[0-2])/{_YEAR}"                                 # 02/12/2026
    rf"|{_DAY} {_MONTH},? {_YEAR}"                                         # 2 December 2026
    rf"|{_MONTH} {_DAY},? {_YEAR}"                                         # December 2, 2026
    rf"|{_MONTH} {_YEAR})(?![\w-])")                                       # Dec 2026
# 7-40 hex digits with at least one digit and one letter a-f ("decade" and "1234567" are not ids), standing
# alone: not inside a longer word or hash, nor part of a file name or identifier (resnet50-11ad3fa6.pth).
COMMIT = re.compile(r"(?<![\w.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])(?!\.\w)")
FENCE = re.compile(r"^\s*(```|~~~)")


def offenders(text: str) -> list[tuple[int, str]]:
    """(line number, match) for every date or commit id outside fenced code blocks."""
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if opening:
            if fence is None:
                fence = opening[1]
            elif opening[1] == fence:
                fence = None
            continue
        if fence is None:
            found += [(number, m[0]) for pattern in (DATE, COMMIT) for m in pattern.finditer(line)]
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_has_no_date_or_commit_id(page):
    found = offenders(page.read_text())
    assert not found, (f"{page.relative_to(ROOT)} dates its facts (line: text): "
                       + ", ".join(f"{n}: {m!r}" for n, m in found)
                       + ". State what is true now and name the command or benchmark that measures it.")


def test_the_check_finds_what_it_names():
    caught = ["Measured on 2026-12-03 on a clean clone", "a clean clone of 37b902f took 18:04 in all",
              "the code of that day (fe3c1d5), run", "(18:36 in all on a clean clone of 008d3a9, 589 passed",
              "24:48 in all on 2 December 2026", "on December 2, 2026 it took", "as of Dec 2026",
              "see commit 23ece67f0a1b2c3d4e5f60718293a4b5c6d7e8f9."]
    for text in caught:
        assert offenders(text), text
    passed = ["a decade of faced, beaded and accede words", "1234567 bytes", "162,541 users x 59,047 movies",
              "-p weights_path /models/resnet50-11ad3fa6.pth", "torch==2.14.1 and unsloth>=2026.10.9",
              "bf16, fp16, a100, 5e-7 and 2e-5", "mAP@0.5 0.4; 0.47M parameters", "sha256 "
              + "0123456789abcdef" * 4, "May I use it? Yes, in March.", "the 12/02 split",
              "```\ngit checkout 37b902f   # 2026-12-03\n```"]
    for text in passed:
        assert not offenders(text), (text, offenders(text))


# The README as it was before it became a front page: a record of measurements, with dates and commit ids.
OLD_README = "23ece67"


def test_the_check_fails_the_old_readme():
    try:
        old = subprocess.run(["git", "show", f"{OLD_README}:README.md"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"this checkout does not hold commit {OLD_README} (a shallow clone)")
    found = offenders(old)
    assert {m for _, m in found} >= {"2026-12-02", "2026-12-03", "37b902f", "fe3c1d5"}, found


def test_make_help_lists_every_target():
    """Every target the Makefile declares has a `## name: what it does` line, and `make help` prints it."""
    makefile = (ROOT / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY:((?:.*\\\n)*.*)$", makefile, re.M)[1].replace("\\\n", " ").split())
    documented = re.findall(r"^## ([\w-]+): \S", makefile, re.M)
    assert set(documented) == phony, (
        f"targets without a '## name:' line: {sorted(phony - set(documented))}; "
        f"'## name:' lines of no target: {sorted(set(documented) - phony)}")
    try:
        printed = subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=ROOT,
                                 capture_output=True, text=True, check=True, timeout=60).stdout
    except FileNotFoundError:
        pytest.skip("no make on this machine")
    assert [line.split()[0] for line in printed.splitlines()] == documented, printed


README_MAX_LINES = 200


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines: move what a reader looks up on purpose to a page under docs/")


def layout_misses(readme: str, package: Path) -> list[str]:
    """The helpers modules and folders the README's Layout section does not name."""
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    words = set(re.findall(r"[\w]+", layout))
    missing = []
    for path in sorted(package.rglob("*.py")):
        name = path.parent.name if path.name == "__init__.py" else path.stem
        if name not in words:
            missing.append(str(path.relative_to(package.parent)))
    return missing


def test_readme_layout_names_every_module():
    missing = layout_misses((ROOT / "README.md").read_text(), ROOT / "helpers")
    assert not missing, f"README.md's Layout does not name {missing}: add a line for each"


def test_the_layout_check_finds_a_missing_module(tmp_path):
    (tmp_path / "helpers" / "sub").mkdir(parents=True)
    for name in ("helpers/a.py", "helpers/sub/__init__.py", "helpers/sub/b.py"):
        (tmp_path / name).write_text("")
    readme = "# x\n\n## Layout\n\n```\nhelpers/ a.py\n  sub/\n```\n\n## Next\nb.py\n"
    assert layout_misses(readme, tmp_path / "helpers") == ["helpers/sub/b.py"]
