"""What too many threads on too few CPUs cost: a thread count from the host's CPUs, and torch's own count,
in a container.

A container limited to 2 CPUs still sees all of its host's CPUs in `os.cpu_count()`. A launcher that gives
each of 2 CPU ranks `os.cpu_count() // 2` threads gives them, on a host of 8 CPUs, 4 threads per rank on 2
CPUs' worth of time; the launcher counts the affinity mask and the cgroup quota instead (helpers/cpus.py).
torch's own default for a process (a notebook kernel) counts the affinity mask but not the quota; `import
helpers` fits it (`helpers.cpus.fit_torch_threads`). This prints, on this machine:

* one conv-net training step (02's backbone, 4 images of 96 px) in 2 processes at once, with 1, 4 and 16
  threads each: what `os.cpu_count() // 2` gives in a 2-CPU container on hosts of 2, 8 and 32 CPUs;
* where a cgroup can be made (root, a writable cpu controller): the same step in one process inside a
  1-CPU quota, with torch's own thread count and after `import helpers.launch` (the launcher fits them).

    python benchmarks/cpu_quota.py [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.nbval_variant_cost import CONV  # noqa: E402
from tests.support import join, one_cpu_cgroup  # noqa: E402

# CONV with torch's own thread count (or, with "helpers", the one importing the launcher leaves); ms a step
CONV_OWN_THREADS = CONV.replace("torch.set_num_threads(int(sys.argv[1]))",
                                "sys.argv[1] == 'helpers' and __import__('helpers.launch')")
assert CONV_OWN_THREADS != CONV, "nbval_variant_cost.CONV no longer sets its threads the way this replaces"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return {**env, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT)}


def pair(threads: int) -> list[float]:
    """ms a step of each of 2 processes stepping at once, `threads` each."""
    procs = [subprocess.Popen([sys.executable, "-c", CONV, str(threads)], env=_env(), stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    return [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


# (hierarchy, a file only that kind of hierarchy has, the files that set a quota of 1 CPU)
def in_group(group: Path, mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", CONV_OWN_THREADS, mode], env=_env(), check=True,
                         capture_output=True, text=True, preexec_fn=lambda: join(group)).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    lines = [f"Conv-net step, 2 processes at once, {cpus} CPUs here.", "",
             "| threads each | ms a step, process 1 | ms a step, process 2 | / 1 thread each |",
             "|---:|---:|---:|---:|"]
    base = None
    for threads in (1, 4, 16):
        ms = pair(threads)
        base = base or sum(ms) / 2
        lines.append(f"| {threads} | {ms[0]:.1f} | {ms[1]:.1f} | {sum(ms) / 2 / base:.1f}x |")
    group = one_cpu_cgroup() if cpus >= 2 else None
    if group is None:
        lines += ["", "No 1-CPU cgroup could be made here (that takes root, a cpu controller, 2+ CPUs)."]
    else:
        try:
            own, fitted = in_group(group, "torch"), in_group(group, "helpers")
        finally:
            group.rmdir()
        lines += ["", "Conv-net step, one process in a 1-CPU quota:", "",
                  "| threads | ms a step | / after importing the launcher |", "|---|---:|---:|",
                  f"| torch's own ({cpus}) | {own:.1f} | {own / fitted:.1f}x |",
                  f"| after importing the launcher (1) | {fitted:.1f} | 1.0x |"]
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
