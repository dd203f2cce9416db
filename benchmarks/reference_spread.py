"""How far a notebook's results move across machines, and the reference file that tolerates it.

Runs a notebook at its default parameters under several conditions that change the arithmetic but not
the lesson, and prints how far each result moved from the native run:

  native      this machine as it is
  avx2        kernels capped at AVX2 (ATen, oneDNN and MKL), as on a machine without AVX-512
  isa         kernels of an older instruction set: ATen without SIMD (ATEN_CPU_CAPABILITY=default),
              oneDNN capped at SSE4.1 (ONEDNN_MAX_CPU_ISA=SSE41), MKL capped at SSE4.2
  threads4    4 intra-op threads per CPU rank (HELPERS_THREADS_PER_PROCESS=4) instead of the usual 1
  seed1 ...   another seed: the noise of training itself (other data, data order and initial weights)

With --write, `notebooks/references/<notebook>.json` gets the native run's results as the reference
values, each with a tolerance taken from the deviations measured (see `tolerances`; for curves, point by
point), and the measurement itself (every run's values, the machine, the command, the rule) next to them.

    python benchmarks/reference_spread.py 01_ddp_mlp [02 ...] [--variants native,avx2,isa,seed1,seed2]
        [--arith-factor 4] [--seed-factor 1] [--write] [--keep DIR [--reuse]]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers._env import ISA_AVX2, ISA_BASELINE, temporary_environ, with_own_inductor_cache  # noqa: E402
from helpers.execute import execute_notebook  # noqa: E402
from helpers.gallery import discover  # noqa: E402
from helpers.reference import REFERENCES_DIR, measured_values  # noqa: E402

ENVIRONMENTS = {
    "native": {},
    "avx2": ISA_AVX2,
    "isa": ISA_BASELINE,
    "threads4": {"HELPERS_THREADS_PER_PROCESS": "4"},
    "threads1": {"HELPERS_THREADS_PER_PROCESS": "1"},
}


def variant_setup(name: str) -> tuple[dict[str, str], dict[str, Any]]:
    """(environment, parameters) of a variant name: native, isa, threads4, threads1, seedN."""
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name], {}
    if name.startswith("seed") and name[4:].isdigit():
        return {}, {"seed": int(name[4:])}
    raise SystemExit(f"unknown variant {name!r}: use {', '.join(ENVIRONMENTS)} or seedN")


def machine() -> str:
    import torch

    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from helpers.cpus import usable_cpus

    return (
        f"{cpu}, {usable_cpus()} CPUs, native ATen capability {torch.backends.cpu.get_cpu_capability()}, "
        f"torch {torch.__version__}"
    )


def run_variant(notebook: Path, variant: str, out_dir: Path, reuse: bool = False) -> dict[str, Any]:
    env, params = variant_setup(variant)
    out = out_dir / f"{notebook.stem}-{variant}.ipynb"
    if reuse and out.exists() and measured_values(out):  # an earlier run of this variant, kept with --keep
        measured = measured_values(out)
        return {
            "variant": variant,
            "seconds": None,
            "error": None,
            "measured": measured["measured"],
            "params": measured["params"],
        }
    start = time.perf_counter()
    error = None
    measuring = {"GALLERY_REFERENCE": "measure", "GALLERY_TRACKING": "off"}
    with temporary_environ({**with_own_inductor_cache(env), **measuring}):
        try:
            execute_notebook(notebook, out, params, timeout=1800)
        except Exception as e:  # a failing bar is a finding too: report it, keep measuring the others
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
    measured = measured_values(out) if out.exists() else None
    return {
        "variant": variant,
        "seconds": round(time.perf_counter() - start, 1),
        "error": error,
        "measured": (measured or {}).get("measured"),
        "params": (measured or {}).get("params"),
    }


def deviations(value: Any, ref: Any) -> list[float]:
    """Absolute differences, one per point of a curve (inf where the shapes differ)."""
    if isinstance(ref, list):
        if not isinstance(value, list) or len(value) != len(ref):
            return [math.inf] * len(ref)
        return [abs(a - b) for a, b in zip(value, ref, strict=True)]
    return [abs(value - ref)]


def round_up(x: float, digits: int = 2) -> float:
    """Round up to `digits` significant digits, so a tolerance is never below what was measured."""
    if x <= 0 or not math.isfinite(x):
        return x
    exponent = math.floor(math.log10(x)) - digits + 1
    return math.ceil(x / 10**exponent) * 10**exponent


def tolerances(
    runs: list[dict[str, Any]], arith_factor: float, seed_factor: float
) -> dict[str, dict[str, Any]]:
    """Per result (per point of a curve): the larger of two measured spreads, with a floor.

    Arithmetic variants (another instruction set, another thread count) change only the rounding, as another
    machine does. Capped at a real machine's instruction set they reproduce that machine: on an AVX-512 host,
    the `avx2` variant of notebook 02 gave the AVX2 host's native results to the last digit (mAP@0.5 0.6245,
    against 0.7465 native). Where no such variant ran, the ones that did can move results less than another
    machine's kernels do, hence `arith_factor` (4 by default; 1.5 is enough with `avx2` in the set). Seed
    variants also change the data, the initial weights and the order: an upper bound of what noise can do,
    taken once (`seed_factor` 1). The floor, 1% of the value plus 1% of the curve's largest value, keeps a
    tolerance
    from being zero where every run agreed to the last digit.
    """
    native = next(r for r in runs if r["variant"] == "native")
    results = {}
    for name, ref in native["measured"].items():
        points = ref if isinstance(ref, list) else [ref]
        scale = max((abs(v) for v in points), default=0.0)
        per_run = {
            r["variant"]: deviations(r["measured"][name], ref)
            for r in runs
            if r["variant"] != "native" and r["measured"] and name in r["measured"]
        }

        seeds = [d for v, d in per_run.items() if v.startswith("seed")]
        arith = [d for v, d in per_run.items() if not v.startswith("seed")]
        tol = [
            round_up(
                max(
                    arith_factor * max((d[i] for d in arith), default=0.0),
                    seed_factor * max((d[i] for d in seeds), default=0.0),
                    0.01 * abs(v) + 0.01 * scale,
                    1e-9,
                )
            )
            for i, v in enumerate(points)
        ]
        results[name] = {
            "value": ref,
            "abs": tol if isinstance(ref, list) else tol[0],
            "largest_deviation": max((max(d, default=0.0) for d in per_run.values()), default=0.0),
            "deviations": {k: round(max(v, default=0.0), 6) for k, v in per_run.items()},
        }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("notebooks", nargs="+", help="notebook names or numbers (01, 02_ddp_retinanet, ...)")
    parser.add_argument("--variants", default="native,isa,threads4,seed1,seed2")
    parser.add_argument(
        "--arith-factor",
        type=float,
        default=4.0,
        help="tolerance >= this x the largest deviation of an instruction-set or thread variant",
    )
    parser.add_argument(
        "--seed-factor",
        type=float,
        default=1.0,
        help="tolerance >= this x the largest deviation of a seed variant",
    )
    parser.add_argument("--write", action="store_true", help="write notebooks/references/<notebook>.json")
    parser.add_argument("--keep", help="keep the executed notebooks in this folder")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --keep: read a variant's results from a notebook executed there earlier",
    )
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if "native" not in variants:
        raise SystemExit("--variants must include 'native': it is the reference run")
    for v in variants:
        variant_setup(v)  # unknown names fail here, before anything runs
    notebooks = discover(args.notebooks)
    out_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="reference-spread-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    host = machine()
    print(f"machine: {host}", flush=True)
    status = 0
    for notebook in notebooks:
        runs = []
        for variant in variants:
            run = run_variant(notebook, variant, out_dir, reuse=args.reuse)
            runs.append(run)
            took = "reused" if run["seconds"] is None else f"{run['seconds']:>6.1f} s"
            print(
                f"{notebook.stem} {variant:>9}: {took} {'FAILED ' + run['error'] if run['error'] else ''}",
                flush=True,
            )
        native = (
            runs[0] if runs[0]["variant"] == "native" else next(r for r in runs if r["variant"] == "native")
        )
        if not native["measured"]:
            print(
                f"{notebook.stem}: the native run recorded no results ({native['error']}); nothing to write"
            )
            status = 1
            continue
        results = tolerances(runs, args.arith_factor, args.seed_factor)
        print(f"\n{notebook.stem}: deviation from the native run, and the tolerance")
        for name, spec in results.items():
            shown = "curve" if isinstance(spec["value"], list) else f"{spec['value']:.4g}"
            devs = ", ".join(f"{k} {v:.3g}" for k, v in spec["deviations"].items())
            tol = spec["abs"]
            shown_tol = f"{min(tol):.2g}..{max(tol):.2g}" if isinstance(tol, list) else f"{tol:.3g}"
            print(f"  {name:<24} {shown:>10}  ±{shown_tol:<12} (largest deviation per run: {devs})")
        if any(r["error"] for r in runs):
            status = 1
        if args.write:
            reference = {
                "notebook": notebook.stem,
                "parameters": native["params"],
                "results": {k: {"value": v["value"], "abs": v["abs"]} for k, v in results.items()},
                "measured": {
                    "machine": host,
                    "date": dt.date.today().isoformat(),
                    "command": f"python benchmarks/reference_spread.py {notebook.stem} "
                    f"--variants {','.join(variants)} --arith-factor {args.arith_factor:g} "
                    f"--seed-factor {args.seed_factor:g} --write",
                    "rule": "abs tolerance (for curves, point by point) = the largest of "
                    f"{args.arith_factor:g} x the "
                    "largest deviation from the native run of an instruction-set or thread variant, "
                    f"{args.seed_factor:g} x that of a seed variant, and 1% of the value plus 1% of the "
                    "curve's largest value; rounded up to 2 significant digits",
                    "variants": {
                        v: {"environment": variant_setup(v)[0], "parameters": variant_setup(v)[1]}
                        for v in variants
                    },
                    "runs": {
                        r["variant"]: {"seconds": r["seconds"], "error": r["error"], "results": r["measured"]}
                        for r in runs
                    },
                    "largest_deviation": {k: v["largest_deviation"] for k, v in results.items()},
                },
            }
            REFERENCES_DIR.mkdir(parents=True, exist_ok=True)
            path = REFERENCES_DIR / f"{notebook.stem}.json"
            path.write_text(json.dumps(reference, indent=1) + "\n")
            print(f"wrote {path.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
