"""nbval plugin: every notebook is compared under kernels that are not the ones that stored its outputs.

Stored outputs come from one machine; nbval must pass on any other. This run proves it on one machine
by changing what differs between machines, per notebook, for the kernel nbval starts (and so for the
ranks it launches):

* the instruction set of the kernels, one of two that did not store the outputs (an AVX-512 machine
  stores them): AVX2 for ATen, oneDNN and MKL (`ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2`,
  `MKL_ENABLE_INSTRUCTIONS=AVX2`), the common machine without AVX-512; or a baseline no real machine
  has, ATen without SIMD (`ATEN_CPU_CAPABILITY=default`), oneDNN capped at SSE4.1, MKL at SSE4.2;
* the intra-op threads per CPU rank (`GALLERY_THREADS_PER_PROCESS`): 1 or 4 (a 2-core machine stores
  with 1; a bigger one would run 4 or more).

`VARIANTS` says which notebook gets which. Both instruction sets and both thread counts run on several
notebooks, each only under variants its reference run measured (so its tolerances cover them:
tests/test_nbval_variants.py holds the table to that). AVX2 goes only to notebooks whose stored run and
reference run came from an AVX-512 host (so it is another machine's arithmetic for them, and their
tolerances were measured under it), first of all the longest, 02; the 4 threads go to shorter runs.
The cost differs a lot on 2 cores: the baseline instruction set and 4 threads per rank slow a step most
(benchmarks/nbval_variant_cost.py prints what each variant costs on the machine it runs on).

Each notebook runs once, so this costs no extra run: the variant replaces the plain one. Set
`NBVAL_VARIANTS=off` to compare under this machine's own kernels. Loaded with
`-p tests.plugins.nbval_variants`.

Private API (checked against nbval 0.11.0 with pytest 9.2.0; tests/test_compat.py resolves each): a
notebook's collector is nbval's `IPyNbFile`, and its `kernel` attribute is None until its first cell
starts the kernel. That is how the hook below knows the kernel is about to start; nbval offers no hook
for it. If either changes, every notebook runs under this machine's own kernels (the variant is never
set): `NBVAL_VARIANTS=off` says the same thing openly until the plugin is updated.
"""

from __future__ import annotations

import os
import re

import pytest

from helpers.env import ISA_AVX2, ISA_BASELINE, env_flag, temporary_environ, with_own_inductor_cache

# Notebooks that run torch.compile on CPU. Inductor reads ATEN_CPU_CAPABILITY too, and with "default" (no
# SIMD) torch 2.14's generated C++ still calls at::vec and fails to build ("'at::vec' has not been declared"
# in notebook 10): they must get AVX2.
COMPILES = {10}

# notebook number: (instruction set, threads per rank); a notebook not listed gets the baseline and 1 thread
VARIANTS: dict[int, tuple[dict[str, str], int]] = {
    0: (ISA_BASELINE, 1),   # the launcher's tour: whole-number sums only, no tolerance to measure
    1: (ISA_BASELINE, 4),
    2: (ISA_AVX2, 1),
    3: (ISA_BASELINE, 4),
    4: (ISA_BASELINE, 1),
    5: (ISA_AVX2, 1),       # the baseline slows its long run most (the "seconds" of its reference runs)
    6: (ISA_AVX2, 1),
    7: (ISA_AVX2, 1),       # the LLM lessons all compare under AVX2: the baseline slows their long runs most
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
    # its own torch.compile cache: Inductor's is not keyed by the capability (helpers.env says what broke)
    return with_own_inductor_cache({**isa, "GALLERY_THREADS_PER_PROCESS": str(threads)})


# (module, attribute path) of each private name used here, for tests/test_compat.py
PRIVATE_API = (("nbval.plugin", "IPyNbFile"),)


def _enabled() -> bool:
    return bool(env_flag("NBVAL_VARIANTS", default=True))


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
    with temporary_environ(variant_for(stem)):
        yield


def pytest_report_header(config):
    if not getattr(config.option, "nbval", False):
        return None
    if not _enabled():
        return "nbval variants: off (this machine's own kernels)"
    runs = ", ".join(f"{n:02d}: {'AVX2' if isa is ISA_AVX2 else 'baseline'}/{threads}t"
                     for n, (isa, threads) in sorted(VARIANTS.items()))
    return f"nbval variants (instruction set / threads per rank): {runs}; baseline = " + ", ".join(
        f"{k}={v}" for k, v in ISA_BASELINE.items())
