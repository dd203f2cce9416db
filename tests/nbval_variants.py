"""nbval plugin: every notebook is compared under kernels that are not the ones that stored its outputs.

Stored outputs come from one machine; nbval must pass on any other. This run proves it on one machine
by changing what differs between machines, per notebook, for the kernel nbval starts (and so for the
ranks it launches):

* the instruction set of the kernels, one of two that did not store the outputs (an AVX-512 machine
  stores them): AVX2 for ATen, oneDNN and MKL (`ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2`,
  `MKL_ENABLE_INSTRUCTIONS=AVX2`), the common machine without AVX-512; or a baseline no real machine
  has, ATen without SIMD (`ATEN_CPU_CAPABILITY=default`), oneDNN capped at SSE4.1, MKL at SSE4.2;
* the intra-op threads per CPU rank (`HELPERS_THREADS_PER_PROCESS`): 1 or 4 (a 2-core machine stores
  with 1; a bigger one would run 4 or more).

`VARIANTS` says which notebook gets which. Both instruction sets and both thread counts run on several
notebooks, each only under variants its reference run measured (so its tolerances cover them:
tests/test_nbval_variants.py holds the table to that). AVX2 goes only to notebooks whose stored run and
reference run came from an AVX-512 host (so it is another machine's arithmetic for them, and their
tolerances were measured under it), first of all the longest, 02; the 4 threads go to shorter runs.
The cost differs a lot on 2 cores:
a conv net's training step took 0.92-1.44x its native time under AVX2 and 1.45-1.88x under the baseline, and
2 ranks of 4 threads on 2 cores 1.94-2.39x the time of 2 ranks of 1 (benchmarks/nbval_variant_cost.py, five
runs on 2026-12-02, 2-core AVX-512 host: noisy, but the order holds in each).

Each notebook runs once, so this costs no extra run: the variant replaces the plain one. Set
`NBVAL_VARIANTS=off` to compare under this machine's own kernels. Loaded with `-p tests.nbval_variants`.
"""

from __future__ import annotations

import os
import re

import pytest

from helpers._env import ISA_AVX2, ISA_BASELINE, with_own_inductor_cache

# Notebooks that run torch.compile on CPU. Inductor reads ATEN_CPU_CAPABILITY too, and with "default" (no
# SIMD) torch 2.14's generated C++ still calls at::vec and fails to build ("'at::vec' has not been declared",
# notebook 10, 2026-12-02): they must get AVX2.
COMPILES = {10}

# notebook number: (instruction set, threads per rank); a notebook not listed gets the baseline and 1 thread
VARIANTS: dict[int, tuple[dict[str, str], int]] = {
    0: (ISA_BASELINE, 1),   # the launcher's tour: whole-number sums only, no tolerance to measure
    1: (ISA_BASELINE, 4),
    2: (ISA_AVX2, 1),
    3: (ISA_BASELINE, 4),
    4: (ISA_BASELINE, 1),
    5: (ISA_BASELINE, 1),
    6: (ISA_AVX2, 1),
    7: (ISA_BASELINE, 1),
    8: (ISA_AVX2, 1),
    9: (ISA_AVX2, 1),
    10: (ISA_AVX2, 1),
}


def variant_for(notebook_stem: str) -> dict[str, str]:
    """The environment one notebook's nbval kernel gets: another ISA, and 1 or 4 threads per rank."""
    match = re.match(r"(\d+)_", notebook_stem)
    number = int(match.group(1)) if match else 0
    isa, threads = VARIANTS.get(number, (ISA_BASELINE, 1))
    if number in COMPILES:
        isa = {**isa, "ATEN_CPU_CAPABILITY": "avx2"}
    # its own torch.compile cache: Inductor's is not keyed by the capability (helpers._env says what broke)
    return with_own_inductor_cache({**isa, "HELPERS_THREADS_PER_PROCESS": str(threads)})


def _enabled() -> bool:
    return os.environ.get("NBVAL_VARIANTS", "on").strip().lower() not in ("off", "0", "false", "no")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    """Set the variant while nbval starts the notebook's kernel (its first cell's setup), then restore."""
    parent = item.parent
    starting_kernel = (
        type(parent).__name__ == "IPyNbFile" and getattr(parent, "kernel", None) is None and _enabled()
    )
    if not starting_kernel:
        yield
        return
    stem = os.path.splitext(os.path.basename(str(parent.fspath)))[0]
    env = variant_for(stem)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pytest_report_header(config):
    if not getattr(config.option, "nbval", False):
        return None
    if not _enabled():
        return "nbval variants: off (this machine's own kernels)"
    runs = ", ".join(f"{n:02d}: {'AVX2' if isa is ISA_AVX2 else 'baseline'}/{threads}t"
                     for n, (isa, threads) in sorted(VARIANTS.items()))
    return f"nbval variants (instruction set / threads per rank): {runs}; baseline = " + ", ".join(
        f"{k}={v}" for k, v in ISA_BASELINE.items())
