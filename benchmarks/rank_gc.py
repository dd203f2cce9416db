"""What the garbage collector costs a rank that has imported the fine-tuning stack, with and without the
launcher's `gc.freeze()` (helpers/launch/payload.py, `Payload.load_call`).

A rank of notebooks 05, 07, 08 or 09 imports torch, transformers, TRL, PEFT, accelerate and DeepSpeed when it
unpickles its function: some 730,000 objects that live as long as the rank. Every full collection walks all
of them, and libraries ask for many (accelerate's `free_memory` at every `Trainer.train`, DeepSpeed's ZeRO
set-up) besides the ones Python runs by itself. The launcher freezes what is alive once the call is loaded;
this launches 2 ranks that import the same stack the same way (module globals of the launched function),
undo the freeze in one run (`gc.unfreeze()`), and time `gc.collect()`.

    .venv/bin/python benchmarks/rank_gc.py [--collections 5] [--markdown FILE]

What the collector costs a whole notebook run can be seen in the notebook itself: a `gc.callbacks` entry in
each rank that sums the time between its "start" and "stop" calls.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import accelerate  # noqa: E402
import deepspeed  # noqa: E402
import peft  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402

from helpers import distributed  # noqa: E402

STACK = (accelerate, deepspeed, peft, transformers, trl)


@distributed(processes=2)
def collect(unfreeze: bool, collections: int) -> dict:
    import gc
    import statistics
    import time

    assert all(STACK)   # the modules above travel as imports: the rank imports them before the freeze
    frozen = gc.get_freeze_count()
    if unfreeze:
        gc.unfreeze()
    times = []
    for _ in range(collections):
        start = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - start)
    return {"frozen": frozen, "tracked": len(gc.get_objects()), "median_s": statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--collections", type=int, default=5)
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    args = parser.parse_args()
    lines = [f"Rank 0 of 2, the fine-tuning stack imported; median of {args.collections} full collections.",
             "", "| rank | objects frozen | objects tracked | gc.collect() (ms) |", "|---|---:|---:|---:|"]
    for label, unfreeze in (("launcher's freeze", False), ("no freeze", True)):
        r = collect.distributed(unfreeze, args.collections)[0]
        lines.append(f"| {label} | {r['frozen']:,} | {r['tracked']:,} | {1000 * r['median_s']:.1f} |")
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
