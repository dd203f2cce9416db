"""Run a notebook at its defaults for several seeds and print, per seed, whether it passed and its headline
metric.

A lesson's default recipe must pass its own bars whatever the seed: a user who changes `seed` and gets a red
notebook has found a recipe that sits on an edge. Each run executes the whole notebook with papermill, only
`seed` changed (and whatever `-p NAME VALUE` adds), tracking off; a run passes when no cell raised. The
headline metrics are the results the notebook's reference file names (`notebooks/references/<stem>.json`),
read from what the run recorded.

    python benchmarks/seed_sweep.py 07                       # seeds 0-9
    python benchmarks/seed_sweep.py 05 08 --seeds 3,4,7,10
    python benchmarks/seed_sweep.py 07 --seeds 0-3 -p strategy fsdp --json runs/sweep-07.json

Exit status 1 if any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers.gallery.execute import check_parameters, execute_notebook, notebook_parameters  # noqa: E402
from helpers.gallery.notebook_io import first_error, read_metrics  # noqa: E402
from helpers.gallery.runner import discover  # noqa: E402
from helpers.metrics import format_metric  # noqa: E402
from helpers.reference import REFERENCES_DIR  # noqa: E402


def parse_seeds(text: str) -> list[int]:
    """'0-9' or '3,4,7,10' (or both: '0-2,7')."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        try:
            seeds += list(range(int(low), int(high) + 1)) if high else [int(low)]
        except ValueError:
            raise SystemExit(f"--seeds {text!r}: give seeds as '0-9' or '3,4,7' (whole numbers)") from None
    return seeds


def headline_names(notebook: Path) -> list[str]:
    """The scalar results the notebook's reference file names; curves are left out of the table."""
    path = REFERENCES_DIR / f"{notebook.stem}.json"
    if not path.exists():
        return []
    results = json.loads(path.read_text())["results"]
    return [name for name, shape in results.items() if shape.get("points") is None]


def run_seed(notebook: Path, seed: int, extra: dict[str, Any], keep: Path) -> dict[str, Any]:
    out = keep / f"{notebook.stem}-seed{seed}.ipynb"
    start = time.perf_counter()
    error = None
    try:
        execute_notebook(notebook, out, dict(extra, seed=seed))
    except Exception as e:   # papermill's execution error; the executed copy says which cell
        error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200] if str(e).strip() else ''}"
    seconds = time.perf_counter() - start
    metrics = read_metrics(out) if out.exists() else {}
    failed = first_error(out) if out.exists() else None
    if failed:
        error = f"cell {failed['cell']}: {failed['ename']}: {(failed['evalue'] or '').splitlines()[0][:200]}"
    return {"notebook": notebook.stem, "seed": seed, "passed": error is None, "error": error,
            "seconds": round(seconds, 1), "metrics": metrics}


def table(rows: list[dict[str, Any]], names: dict[str, list[str]]) -> str:
    lines = []
    for stem in dict.fromkeys(r["notebook"] for r in rows):
        shown = names.get(stem, [])
        lines += [f"\n{stem}", "| seed | result | " + " | ".join(shown) + " | seconds |",
                  "|---:|---|" + "---:|" * len(shown) + "---:|"]
        for r in (r for r in rows if r["notebook"] == stem):
            values = " | ".join(format_metric(r["metrics"].get(n, "-")) for n in shown)
            result = "passes" if r["passed"] else f"fails ({r['error']})"
            lines.append(f"| {r['seed']} | {result} | {values} | {r['seconds']:.0f} |")
        passed = sum(r["passed"] for r in rows if r["notebook"] == stem)
        total = sum(1 for r in rows if r["notebook"] == stem)
        lines.append(f"{passed} of {total} seeds pass")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", help="numbers or stems: 05, 07_trl_sft_gpt_oss")
    parser.add_argument("--seeds", default="0-9", help="'0-9' (default) or '3,4,7,10'")
    parser.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="another parameter for every run (a Python literal, else a string)")
    parser.add_argument("--keep", type=Path, help="keep the executed notebooks in this folder")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)

    import ast

    notebooks = discover(args.notebooks)
    seeds = parse_seeds(args.seeds)
    extra: dict[str, Any] = {}
    for name, value in args.p:
        try:
            extra[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            extra[name] = value
    for notebook in notebooks:   # a misspelt parameter fails now, not after the first run
        check_parameters(notebook, dict(extra, seed=0))
        if "seed" not in notebook_parameters(notebook):
            raise SystemExit(f"{notebook.name} has no seed parameter")
    os.environ["GALLERY_TRACKING"] = "off"
    keep = args.keep or Path(tempfile.mkdtemp(prefix="seed-sweep-"))
    keep.mkdir(parents=True, exist_ok=True)
    names = {nb.stem: headline_names(nb) for nb in notebooks}
    rows = []
    for notebook in notebooks:
        for seed in seeds:
            row = run_seed(notebook, seed, extra, keep)
            rows.append(row)
            status = "passes" if row["passed"] else f"FAILS: {row['error']}"
            shown = ", ".join(f"{n} {format_metric(row['metrics'][n])}" for n in names[notebook.stem]
                              if n in row["metrics"])
            print(f"{notebook.stem} seed {seed}: {status} ({shown}; {row['seconds']:.0f} s)", flush=True)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(rows, indent=1, default=str))
    print(table(rows, names))
    print(f"\nexecuted notebooks: {keep}")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
