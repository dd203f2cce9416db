"""The environments nbval's variants give the notebooks' kernels (tests/nbval_variants.py)."""

import os

from helpers._env import with_own_inductor_cache
from tests.nbval_variants import COMPILES, ISA_BASELINE, variant_for


def test_every_notebook_runs_under_another_instruction_set_and_thread_count():
    assert variant_for("02_ddp_retinanet")["ATEN_CPU_CAPABILITY"] == "default"
    assert variant_for("02_ddp_retinanet")["HELPERS_THREADS_PER_PROCESS"] == "1"
    assert variant_for("03_lightning_two_tower_mds")["HELPERS_THREADS_PER_PROCESS"] == "4"
    compiling = variant_for(f"{min(COMPILES):02d}_x")
    # torch.compile cannot build its C++ without SIMD: ATen keeps AVX2, the matmul libraries stay capped
    assert compiling["ATEN_CPU_CAPABILITY"] == "avx2"
    assert compiling["ONEDNN_MAX_CPU_ISA"] == ISA_BASELINE["ONEDNN_MAX_CPU_ISA"]


def test_a_simulated_instruction_set_compiles_into_a_cache_of_its_own():
    """Inductor reused kernels across ATen capabilities (a crash, NaN losses): never the user's cache."""
    import torch._inductor.runtime.cache_dir_utils as cache_dir_utils

    default = cache_dir_utils.default_cache_dir()
    dirs = {variant_for(stem)["TORCHINDUCTOR_CACHE_DIR"] for stem in ("02_x", f"{min(COMPILES):02d}_x")}
    assert len(dirs) == 2 and default not in dirs
    assert all(os.path.basename(d).endswith(("_aten_default", "_aten_avx2")) for d in dirs)
    threads_only = {"HELPERS_THREADS_PER_PROCESS": "4"}
    assert with_own_inductor_cache(threads_only) == threads_only
