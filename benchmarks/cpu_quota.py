"""What too many threads on too few CPUs cost: the old thread rule, and torch's own count, in a container.

A container limited to 2 CPUs still sees all of its host's CPUs in `os.cpu_count()`. The launcher once gave
each of 2 CPU ranks `os.cpu_count() // 2` threads: on a host of 8 CPUs, 4 threads per rank on 2 CPUs' worth
of time. It now counts the affinity mask and the cgroup quota (helpers/cpus.py). torch's own default for a
process (a notebook kernel) counts the affinity mask but not the quota; `import helpers` fits it
(`helpers.cpus.fit_torch_threads`). This prints, on this machine:

* one conv-net training step (02's backbone, 4 images of 96 px) in 2 processes at once, with 1, 4 and 16
  threads each: what the old rule gave in a 2-CPU container on hosts of 2, 8 and 32 CPUs;
* where a cgroup can be made (root, a writable cpu controller): the same step in one process inside a
  1-CPU quota, with torch's own thread count and after `import helpers`.

    python benchmarks/cpu_quota.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.nbval_variant_cost import CONV  # noqa: E402
from tests.support import join, one_cpu_cgroup  # noqa: E402

# CONV with torch's own thread count (or, with "helpers", the one `import helpers` leaves); ms a step
CONV_OWN_THREADS = CONV.replace("torch.set_num_threads(int(sys.argv[1]))",
                                "sys.argv[1] == 'helpers' and __import__('helpers')")
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
    cpus = len(os.sched_getaffinity(0))
    print(f"{cpus} CPUs here. Conv-net step, 2 processes at once:")
    base = None
    for threads in (1, 4, 16):
        ms = pair(threads)
        base = base or sum(ms) / 2
        print(f"  {threads:2d} threads each: {ms[0]:7.1f} / {ms[1]:7.1f} ms  ({sum(ms) / 2 / base:.1f}x)")
    group = one_cpu_cgroup() if cpus >= 2 else None
    if group is None:
        print("no 1-CPU cgroup could be made here (needs root, a writable cpu controller and 2+ CPUs)")
        return
    try:
        own, fitted = in_group(group, "torch"), in_group(group, "helpers")
    finally:
        group.rmdir()
    print(f"Conv-net step, one process in a 1-CPU quota: torch's own {cpus} threads {own:.1f} ms, "
          f"after import helpers (1 thread) {fitted:.1f} ms ({own / fitted:.1f}x)")


if __name__ == "__main__":
    main()
