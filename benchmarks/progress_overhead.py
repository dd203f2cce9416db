"""What rank 0's progress bar costs a training loop, per step.

Prints the time per iteration of an empty loop, of the same loop through `progress_bar` on a rank that does
not draw (rank 1), and on rank 0 sending to the local launcher's folder (the file relay, throttled to five
states a second), next to plain tqdm writing to /dev/null. A real training step takes milliseconds; the
figures here are in microseconds.

    .venv/bin/python benchmarks/progress_overhead.py [--steps 200000] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from helpers.progress import PROGRESS_DIR_ENV, progress_bar


def per_step(loop, steps: int) -> float:
    start = time.perf_counter()
    loop(steps)
    return (time.perf_counter() - start) / steps * 1e6


def empty(steps: int) -> None:
    for _ in range(steps):
        pass


def other_rank(steps: int) -> None:
    for _ in progress_bar(range(steps), rank=1):
        pass


def rank0_to_launcher(steps: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        os.environ[PROGRESS_DIR_ENV] = folder
        try:
            bar = progress_bar(total=steps, desc="bench", rank=0)
            for i in range(steps):
                bar.update()
                if i % 100 == 0:
                    bar.set_postfix(loss=1.0 / (i + 1))
            bar.close()
        finally:
            del os.environ[PROGRESS_DIR_ENV]


def plain_tqdm(steps: int) -> None:
    from tqdm import tqdm

    with open(os.devnull, "w") as sink:
        for _ in tqdm(range(steps), file=sink):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    args = parser.parse_args()
    steps = args.steps
    rows = [("empty loop", empty), ("progress_bar on rank 1 (not drawn)", other_rank),
            ("progress_bar on rank 0 (file relay)", rank0_to_launcher), ("tqdm to /dev/null", plain_tqdm)]
    lines = [f"Time per loop step, the best of 3 loops of {steps:,} steps.", "",
             f"| loop ({steps:,} steps) | µs per step |", "|---|---:|"]
    for name, loop in rows:
        lines.append(f"| {name} | {min(per_step(loop, steps) for _ in range(3)):.3f} |")
        print(lines[-1] if len(lines) > 5 else "\n".join(lines), flush=True)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
