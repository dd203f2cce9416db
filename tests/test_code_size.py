"""No module of helpers/ or tools/ over 450 lines, no function over 60: a module that size has more than one
job, a function that long more than one decision, and both are where changes go wrong.
`python -m tests.test_code_size` lists the offenders."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def offenders(folders: tuple[str, ...] = ("helpers", "tools"), root: Path = ROOT) -> list[str]:
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            source = path.read_text()
            where = path.relative_to(root)
            if (lines := len(source.splitlines())) > MAX_MODULE_LINES:
                found.append(f"{where}: {lines} lines (at most {MAX_MODULE_LINES}): split it by what its "
                             "parts do")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(f"{where}:{node.lineno} {node.name}: {length} lines "
                                     f"(at most {MAX_FUNCTION_LINES})")
    return found


def test_no_module_or_function_over_its_size():
    assert offenders() == [], "\n".join(offenders())


def test_an_oversized_module_and_function_are_found(tmp_path):
    long_body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "big.py").write_text(f"def long():\n{long_body}\n" + "\n" * 400)
    (tmp_path / "helpers" / "small.py").write_text(f"def short():\n{long_body[:200]}\n")
    found = offenders(("helpers",), tmp_path)
    assert found == ["helpers/big.py: 462 lines (at most 450): split it by what its parts do",
                     "helpers/big.py:1 long: 62 lines (at most 60)"], found


if __name__ == "__main__":
    print("\n".join(offenders()) or "none")
