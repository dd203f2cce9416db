"""Notebook 03's driver memory at three data shapes: it must not grow with users x movies.

The evaluation samples `eval_users` users and scores them in chunks with sparse seen/held sets: dense users
x movies masks would take 10 GB each at the ml-25m shape, and a dense score matrix 40 GB. This runs the
notebook at the default 1k-user shape, a 25k-user shape and the ml-25m shape (162,541 users x 59,047 movies;
fewer ratings than the real 25M), with the scale-up parameters (helpers.gallery.scale_up) for the two larger
ones and a step cap, and prints the kernel's peak resident memory (`driver_peak_rss_mb`, recorded by the
notebook) with the wall time.

    .venv/bin/python benchmarks/driver_memory_03.py [--shapes 1k,25k,ml-25m] [--limit-mb 4096] [--markdown F]

Exit status 1 if the ml-25m shape's driver peaks above the limit (4 GB by default).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers.data.movielens import ML25M_MOVIES, ML25M_USERS, build_movielens_shaped  # noqa: E402
from helpers.gallery.execute import execute_notebook
from helpers.gallery.notebook_io import read_metrics  # noqa: E402
from helpers.gallery.scale_up import cli_parameters  # noqa: E402
from helpers.paths import NOTEBOOKS_DIR  # noqa: E402

NOTEBOOK = "03_lightning_two_tower_mds"
SHAPES = {"1k": None, "25k": (25_000, 10_000), "ml-25m": (ML25M_USERS, ML25M_MOVIES)}
CAP = dict(max_steps=2, parity_steps=1)


def run_shape(shape: str, work: Path) -> dict:
    if SHAPES[shape] is None:
        params = dict(CAP)                                   # the defaults: 1,000 users x 500 movies
    else:
        users, movies = SHAPES[shape]
        data = build_movielens_shaped(work / f"data-{shape}", num_users=users, num_movies=movies)
        params = {**cli_parameters(NOTEBOOK), **CAP, "data_path": str(data.ratings_csv.parent),
                  "mds_dir": str(work / f"mds-{shape}"), "tracking_uri": None}
    start = time.perf_counter()
    nb = execute_notebook(NOTEBOOKS_DIR / f"{NOTEBOOK}.ipynb", work / f"{NOTEBOOK}-{shape}.ipynb", params)
    metrics = read_metrics(nb)
    return {"shape": shape, "peak_mb": metrics["driver_peak_rss_mb"], "seconds": time.perf_counter() - start}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    parser.add_argument("--limit-mb", type=float, default=4096.0)
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    args = parser.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        parser.error(f"unknown shape(s) {unknown}; use {', '.join(SHAPES)}")
    os.environ.setdefault("GALLERY_TRACKING", "off")
    with tempfile.TemporaryDirectory(prefix="driver-memory-") as tmp:
        rows = [run_shape(shape, Path(tmp)) for shape in shapes]
    lines = [f"Notebook 03 with a step cap ({', '.join(f'{k}={v}' for k, v in CAP.items())}).", "",
             "| shape | users x movies | driver peak RSS (MB) | wall (s) |", "|---|---:|---:|---:|"]
    for row in rows:
        dims = "1,000 x 500" if SHAPES[row["shape"]] is None else "{:,} x {:,}".format(*SHAPES[row["shape"]])
        lines.append(f"| {row['shape']} | {dims} | {row['peak_mb']:,.0f} | {row['seconds']:.0f} |")
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    over = [r for r in rows if r["shape"] == "ml-25m" and r["peak_mb"] > args.limit_mb]
    if over:
        print(f"the driver peaked above {args.limit_mb:,.0f} MB at the ml-25m shape", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
