"""nbval plugin: every notebook is compared under kernels that are not the ones that stored its outputs.

Stored outputs come from one machine; nbval must pass on any other. This run proves it on one machine
by changing what differs between machines, per notebook, for the kernel nbval starts (and so for the
ranks it launches):

* the instruction set of the kernels: ATen without SIMD (`ATEN_CPU_CAPABILITY=default`), oneDNN capped
  at SSE4.1 (`ONEDNN_MAX_CPU_ISA=SSE41`), MKL capped at SSE4.2 (`MKL_ENABLE_INSTRUCTIONS=SSE4_2`):
  every machine that stores outputs has at least AVX2, so this is always another machine's arithmetic;
* the intra-op threads per CPU rank (`HELPERS_THREADS_PER_PROCESS`): 1 or 4, alternating by notebook
  number (a 2-core machine stores with 1; a bigger one would run 4 or more).

Each notebook runs once, so this costs no extra run: the variant replaces the plain one. Set
`NBVAL_VARIANTS=off` to compare under this machine's own kernels. Loaded with `-p tests.nbval_variants`.
"""

from __future__ import annotations

import os
import re

import pytest

from helpers._env import with_own_inductor_cache

ISA_BASELINE = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
}


# Notebooks that run torch.compile on CPU. Inductor reads ATEN_CPU_CAPABILITY too, and with "default" (no
# SIMD) torch 2.14's generated C++ still calls at::vec and fails to build ("'at::vec' has not been declared",
# notebook 10, 2026-12-02). No real x86 machine runs without SIMD, so these keep AVX2 for ATen and Inductor
# while oneDNN and MKL (the matmuls, most of the arithmetic) stay capped at SSE4.
COMPILES = {10}


def variant_for(notebook_stem: str) -> dict[str, str]:
    """The environment one notebook's nbval kernel gets: another ISA, and 1 or 4 threads per rank."""
    match = re.match(r"(\d+)_", notebook_stem)
    number = int(match.group(1)) if match else 0
    isa = {**ISA_BASELINE, "ATEN_CPU_CAPABILITY": "avx2"} if number in COMPILES else ISA_BASELINE
    # its own torch.compile cache: Inductor's is not keyed by the capability (helpers._env says what broke)
    return with_own_inductor_cache({**isa, "HELPERS_THREADS_PER_PROCESS": "4" if number % 2 else "1"})


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
    return (
        "nbval variants: every notebook under another instruction set "
        f"({', '.join(f'{k}={v}' for k, v in ISA_BASELINE.items())}); "
        "threads per rank 4 for odd-numbered notebooks, 1 for even"
    )
