"""Launch latency on 2 CPU processes: helpers.distributed vs accelerate.notebook_launcher vs torchrun.

Latency = time from the launch call until every rank has printed its first line (each rank stamps the
wall clock as it prints; same machine, same clock). Cold = the first launch in a fresh interpreter
(for helpers and accelerate, the interpreter has already imported them and torch, as a notebook kernel
would have after its imports cell; for torchrun, the command is started from scratch, as `!torchrun`
from a cell is). Warm = a later launch in the same interpreter (torchrun has no warm state: every
launch is a new command). Medians over several runs.

    python benchmarks/launch_latency.py [--runs 5] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PROCESSES = 2

HELPERS_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    from helpers import distributed

    @distributed(processes=2, device="cpu")
    def first_line():
        t = time.time()
        print(f"rank {os.environ['RANK']} up", flush=True)
        return t

    out = []
    for _ in range(int(sys.argv[1])):
        t0 = time.time()
        stamps = first_line.distributed()
        out.append(max(stamps) - t0)
    print("RESULT " + json.dumps(out))
    """
)

ACCELERATE_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import torch
    from accelerate import notebook_launcher

    def first_line(path):
        t = time.time()
        print(f"rank {os.environ.get('RANK')} up", flush=True)
        with open(path + "." + os.environ.get("RANK", "0"), "w") as f:
            f.write(str(t))

    out = []
    for i in range(int(sys.argv[1])):
        path = f"{sys.argv[2]}/acc{i}"
        t0 = time.time()
        notebook_launcher(first_line, (path,), num_processes=2, use_port=str(29600 + i))
        out.append(max(float(open(f"{path}.{r}").read()) for r in range(2)) - t0)
    print("RESULT " + json.dumps(out))
    """
)

TORCHRUN_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    t = time.time()
    print(f"rank {os.environ['RANK']} up", flush=True)
    with open(sys.argv[1] + "." + os.environ["RANK"], "w") as f:
        f.write(str(t))
    """
)


def _child(code: str, runs: int, tmp: Path) -> list[float]:
    script = tmp / "child.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script), str(runs), str(tmp)], capture_output=True, text=True,
                          timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"benchmark child failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def measure_helpers(runs: int, tmp: Path) -> tuple[list[float], list[float]]:
    cold = [_child(HELPERS_CHILD, 1, tmp)[0] for _ in range(runs)]
    warm = _child(HELPERS_CHILD, runs + 1, tmp)[1:]
    return cold, warm


def measure_accelerate(runs: int, tmp: Path) -> tuple[list[float], list[float]]:
    cold = [_child(ACCELERATE_CHILD, 1, tmp)[0] for _ in range(runs)]
    warm = _child(ACCELERATE_CHILD, runs + 1, tmp)[1:]
    return cold, warm


def measure_torchrun(runs: int, tmp: Path) -> list[float]:
    import time

    script = tmp / "torchrun_child.py"
    script.write_text(TORCHRUN_SCRIPT)
    torchrun = Path(sys.executable).with_name("torchrun")
    out = []
    for i in range(runs):
        stamp = tmp / f"tr{i}"
        t0 = time.time()
        subprocess.run([str(torchrun), "--standalone", f"--nproc-per-node={PROCESSES}", str(script),
                        str(stamp)], check=True, capture_output=True, timeout=300)
        out.append(max(float(Path(f"{stamp}.{r}").read_text()) for r in range(PROCESSES)) - t0)
    return out


def verdict(met: bool) -> str:
    return "met" if met else "missed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    args = parser.parse_args()
    rows, notes = [], []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        h_cold, h_warm = measure_helpers(args.runs, tmp)
        rows.append(("helpers.distributed", statistics.median(h_cold), statistics.median(h_warm)))
        try:
            a_cold, a_warm = measure_accelerate(args.runs, tmp)
            rows.append(("accelerate.notebook_launcher", statistics.median(a_cold),
                         statistics.median(a_warm)))
        except Exception as e:  # keep the other figures if accelerate refuses this machine
            print(f"accelerate.notebook_launcher could not be measured: {str(e)[-500:]}", file=sys.stderr)
            notes.append("accelerate.notebook_launcher could not be measured here (its error: stderr).")
        t = statistics.median(measure_torchrun(args.runs, tmp))
        rows.append(("torchrun (new command each time)", t, t))
    lines = [f"Time to the first line of every rank, {PROCESSES} CPU processes, median of {args.runs} runs.",
             "",
             f"| {'launcher':<34} | {'cold (s)':>9} | {'warm (s)':>9} |",
             f"|{'-' * 36}|{'-' * 10}:|{'-' * 10}:|"]
    lines += [f"| {name:<34} | {cold:>9.3f} | {warm:>9.3f} |" for name, cold, warm in rows]
    torchrun_time = rows[-1][1]
    warm, cold = rows[0][2] / torchrun_time, rows[0][1] / torchrun_time
    lines += ["", f"helpers warm / torchrun: {warm:.3f} (target <= 0.1: {verdict(warm <= 0.1)}); "
                  f"helpers cold / torchrun: {cold:.2f} (target <= 1: {verdict(cold <= 1)})."]
    if cold > 1:
        lines.append("A cold launch starts the launcher's forkserver, which imports torch, as torchrun's "
                     "new interpreter does, so the two stay close; a notebook starts the forkserver when it "
                     "decorates its function or calls preload(), cells before its first launch, which then "
                     "costs the warm figure.")
    lines += notes
    report = "\n".join(lines)
    print("\n" + report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")


if __name__ == "__main__":
    main()
