"""How many CPUs this process may really use: its affinity mask and its container's CPU quota.

`os.cpu_count()` is the host's count. In a container limited to 2 CPUs on a 64-core host it says 64,
and a launcher that shares 64 cores out between 2 ranks starts 32 threads per rank on 2 CPUs' worth of
time: every rank then spends most of its time waiting for the scheduler. The kernel enforces two
limits, and both are read here: the affinity mask (`taskset`, `docker --cpuset-cpus`, Slurm) and the
CFS bandwidth quota (`docker --cpus`, Kubernetes CPU limits), from cgroup v2 or v1.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from helpers.env import project_env, project_env_name

# Where the cgroup file systems are mounted; a test points these at a fake tree.
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup_paths(proc_self_cgroup: Path) -> dict[str, str]:
    """{controller or '' (cgroup v2): path of this process's cgroup}, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    try:
        text = proc_self_cgroup.read_text()
    except OSError:
        return paths
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths[""] = path
        for controller in controllers.split(","):
            paths[controller] = path
    return paths


def _quota_v2(root: Path, own: str | None) -> float | None:
    """CPUs allowed by cgroup v2's `cpu.max` ("max 100000" or "200000 100000"), the tightest up the tree."""
    candidates = []
    if own is not None:
        here = root / own.lstrip("/")
        while True:
            candidates.append(here / "cpu.max")
            if here == root or root not in here.parents:
                break
            here = here.parent
    candidates.append(root / "cpu.max")
    limits = []
    for path in dict.fromkeys(candidates):
        try:
            quota, period = path.read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota != "max" and int(period) > 0:
            limits.append(int(quota) / int(period))
    return min(limits) if limits else None


def _quota_v1(root: Path, own: str | None) -> float | None:
    """CPUs allowed by cgroup v1's `cpu.cfs_quota_us` / `cpu.cfs_period_us` (-1: no quota)."""
    for base in (root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
        folders = [base / own.lstrip("/")] if own else []
        folders.append(base)
        for folder in folders:
            try:
                quota = int((folder / "cpu.cfs_quota_us").read_text())
                period = int((folder / "cpu.cfs_period_us").read_text())
            except (OSError, ValueError):
                continue
            if quota > 0 and period > 0:
                return quota / period
    return None


def cpu_quota(root: Path | None = None, proc_self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The container's CPU limit in CPUs (may be fractional), or None when no quota is set."""
    root = CGROUP_ROOT if root is None else root
    own = _own_cgroup_paths(proc_self_cgroup)
    quota = _quota_v2(root, own.get(""))
    if quota is None:
        quota = _quota_v1(root, own.get("cpu"))
    return quota


def usable_cpus(root: Path | None = None, proc_self_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """CPUs this process may use: the affinity mask, capped by the cgroup quota (rounded up), at least 1."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    quota = cpu_quota(root, proc_self_cgroup)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def threads_per_rank(processes: int, root: Path | None = None, cpus: int | None = None) -> int:
    """Intra-op threads for each of `processes` CPU ranks: the usable CPUs (or `cpus`) shared out, at least 1.

    `GALLERY_THREADS_PER_PROCESS` sets it for every launch (e.g. to test another thread count without
    changing a notebook); a launch's own `threads_per_process` option still wins over both.
    """
    forced = (project_env("THREADS_PER_PROCESS") or "").strip()
    if forced:
        try:
            value = int(forced)
        except ValueError:
            value = 0
        if value < 1:
            variable = project_env_name("THREADS_PER_PROCESS")
            raise ValueError(f"{variable}={forced!r}: set a whole number >= 1, or unset it.")
        return value
    return max(1, (usable_cpus(root) if cpus is None else cpus) // max(1, processes))


def fit_torch_threads(root: Path | None = None) -> int | None:
    """Lower this process's torch intra-op threads to the CPUs it may use: the new count, or None (unchanged).

    torch counts the CPUs of the affinity mask and ignores the container's CFS quota, so a notebook kernel in
    a container limited to 1 CPU on a 2-CPU host runs its own torch work (scoring, data building) on 2
    threads, each slower than one thread per CPU (benchmarks/cpu_quota.py measures it). The ranks get their
    count from the launcher; importing the launcher (`helpers.launch`) calls this for the process that imports
    it. A count set through OMP_NUM_THREADS or MKL_NUM_THREADS, or one within the quota, is left alone.
    """
    if os.environ.get("OMP_NUM_THREADS", "").strip() or os.environ.get("MKL_NUM_THREADS", "").strip():
        return None
    import torch

    usable = usable_cpus(root)
    if torch.get_num_threads() <= usable:
        return None
    torch.set_num_threads(usable)
    return usable
