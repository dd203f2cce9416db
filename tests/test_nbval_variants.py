"""The environments nbval's variants give the notebooks' kernels (tests/plugins/nbval_variants.py)."""

import os

from helpers.env import with_own_inductor_cache
from tests.plugins.nbval_variants import COMPILES, VARIANTS, variant_for


def test_every_notebook_runs_under_another_instruction_set_and_thread_count():
    from helpers.paths import NOTEBOOKS_DIR

    stems = [p.stem for p in sorted(NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))]
    numbers = {int(stem[:2]) for stem in stems}
    assert numbers <= set(VARIANTS), f"give {sorted(numbers - set(VARIANTS))} a variant in VARIANTS"
    variants = [variant_for(stem) for stem in stems]
    # never this machine's own kernels: every notebook under AVX2 or the baseline, and both are used
    assert all(v["ATEN_CPU_CAPABILITY"] in ("avx2", "default") for v in variants)
    assert all(v["ONEDNN_MAX_CPU_ISA"] in ("AVX2", "SSE41") for v in variants)
    assert {v["ONEDNN_MAX_CPU_ISA"] for v in variants} == {"AVX2", "SSE41"}
    assert {v["GALLERY_THREADS_PER_PROCESS"] for v in variants} == {"1", "4"}
    assert variant_for("02_ddp_retinanet")["ATEN_CPU_CAPABILITY"] == "avx2"
    assert variant_for("03_lightning_two_tower_mds")["GALLERY_THREADS_PER_PROCESS"] == "4"
    assert variant_for("04_fsdp_transformer")["ATEN_CPU_CAPABILITY"] == "default"
    # torch.compile cannot build its C++ without SIMD: a compiling notebook always gets ATen's AVX2
    assert all(variant_for(f"{n:02d}_x")["ATEN_CPU_CAPABILITY"] == "avx2" for n in COMPILES)


def test_a_simulated_instruction_set_compiles_into_a_cache_of_its_own():
    """Inductor reused kernels across ATen capabilities (a crash, NaN losses): never the user's cache."""
    import torch._inductor.runtime.cache_dir_utils as cache_dir_utils

    default = cache_dir_utils.default_cache_dir()
    dirs = {variant_for(stem)["TORCHINDUCTOR_CACHE_DIR"] for stem in ("04_x", f"{min(COMPILES):02d}_x")}
    assert len(dirs) == 2 and default not in dirs
    assert all(os.path.basename(d).endswith(("_aten_default", "_aten_avx2")) for d in dirs)
    threads_only = {"GALLERY_THREADS_PER_PROCESS": "4"}
    assert with_own_inductor_cache(threads_only) == threads_only


def _measured_variant_names(stem: str) -> set[str]:
    """The parts (avx2, isa, threads4, ...) of every variant the reference was fitted or validated on."""
    from helpers.reference import load_reference

    ref = load_reference(stem)
    runs = ref["fit"]["runs"] + ref["validation"]["runs"]
    return {part for run in runs for part in run["variant"].split("+")}


def _required_variant_names(stem: str) -> set[str]:
    """The reference-run variants whose spread covers what nbval gives this notebook's kernel."""
    env = variant_for(stem)
    needed = {"avx2" if env["ONEDNN_MAX_CPU_ISA"] == "AVX2" else "isa"}
    if env["GALLERY_THREADS_PER_PROCESS"] != "1":
        needed.add(f"threads{env['GALLERY_THREADS_PER_PROCESS']}")
    return needed


def test_nbval_runs_each_notebook_only_under_arithmetic_its_tolerances_were_measured_under():
    """A notebook's tolerances are fitted and validated on its reference variants
    (benchmarks/reference_spread.py): nbval may compare it only under an instruction set and thread count
    among them, or a pass proves nothing measured and a failure is noise, not a regression."""
    from tests.support import training_notebooks

    for path in training_notebooks():   # the launcher's tour compares no arithmetic: it has no tolerances
        missing = _required_variant_names(path.stem) - _measured_variant_names(path.stem)
        assert not missing, (
            f"{path.stem}: nbval runs it under {sorted(missing)}, which its reference run did not measure; "
            "change VARIANTS in tests/plugins/nbval_variants.py, or measure them: "
            f"benchmarks/reference_spread.py {path.stem[:2]} --validate {'+'.join(sorted(missing))} --write")


def test_an_unmeasured_variant_is_caught(monkeypatch):
    import tests.plugins.nbval_variants as nbval_variants

    monkeypatch.setitem(nbval_variants.VARIANTS, 5, (nbval_variants.ISA_AVX2, 16))
    stem = "05_deepspeed_zero_sft"
    assert _required_variant_names(stem) == {"avx2", "threads16"}
    assert "threads16" in _required_variant_names(stem) - _measured_variant_names(stem)
