"""Fit a notebook's reference tolerances, validate them on runs they were not fitted to, and prove they guard.

Every run executes the notebook at its default parameters under a variant that changes the arithmetic or
the noise of training, but not the lesson:

  native        this machine as it is
  avx2          kernels capped at AVX2 (ATen, oneDNN and MKL), as on a machine without AVX-512
  isa           an older instruction set: ATen without SIMD, oneDNN at SSE4.1, MKL at SSE4.2
  threadsN      N intra-op threads per CPU rank (GALLERY_THREADS_PER_PROCESS) instead of the usual 1
  seedN         another seed: other data, data order and initial weights
  a+b           both (e.g. isa+threads4, what nbval gives notebook 01 in `make test`)

Three modes, each for the notebooks named (01, 02_ddp_retinanet, ...), or for every notebook with a reference
file when none is named:

  --fit V1,V2,...    run the variants, add the runs the reference file already holds (from other machines;
                     --fresh drops them), and fit: each statistic (a number; a curve's mean and the mean of
                     its last third) gets the mean of the runs and a tolerance of k standard deviations, k
                     the Student-t prediction bound at the file's false-alarm rate (helpers.reference.fit);
                     --report-only names statistics to show but not compare
  --validate V,...   run variants the file was not fitted on and report, per run, the statistic nearest its
                     bound and the share of the tolerance it used (exit 1 if any run falls outside)
  --guard            run the regression named in the file's "guard" (one line of the notebook changed) and
                     report whether the reference check catches it while the notebook's bars pass
  --table            print the validation and guard table of the files, running nothing (with --write,
                     into docs/reference-check.md)

With --write the runs and the fit go into `notebooks/references/<notebook>.json`. --keep DIR keeps the
executed notebooks (and with --reuse reads a variant's results from there instead of running it again,
where the kept run executed the same code: an edited notebook or a new guard runs afresh).

    python benchmarks/reference_spread.py 02 --fit native,avx2,seed3,seed4,seed5 --write
    python benchmarks/reference_spread.py 02 --validate seed6,seed7,threads4 --write
    python benchmarks/reference_spread.py --table
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from helpers import tracking  # noqa: E402
from helpers.env import ISA_AVX2, ISA_BASELINE, temporary_environ, with_own_inductor_cache  # noqa: E402
from helpers.files import atomic_write  # noqa: E402
from helpers.gallery.notebook_io import first_error, reference_values  # noqa: E402
from helpers.reference import (  # noqa: E402
    FORMAT,
    REFERENCE_MODE_ENV,
    REFERENCES_DIR,
    fit,
    judge,
    repeats_a_fitting_run,
    validation_table,
)

TABLE_START, TABLE_END = "<!-- reference-table -->", "<!-- /reference-table -->"

ENVIRONMENTS = {
    "native": {},
    "avx2": dict(ISA_AVX2),
    "isa": dict(ISA_BASELINE),
}


def variant_setup(name: str) -> tuple[dict[str, str], dict[str, Any]]:
    """(environment, parameters) of a variant name: native, avx2, isa, threadsN, seedN, or a+b."""
    env: dict[str, str] = {}
    params: dict[str, Any] = {}
    for part in name.split("+"):
        if part in ENVIRONMENTS:
            env.update(ENVIRONMENTS[part])
        elif part.startswith("threads") and part[7:].isdigit():
            env["GALLERY_THREADS_PER_PROCESS"] = part[7:]
        elif part.startswith("seed") and part[4:].isdigit():
            params["seed"] = int(part[4:])
        else:
            raise SystemExit(f"unknown variant {name!r}: use native, avx2, isa, threadsN, seedN or a+b")
    return env, params


def machine() -> str:
    from helpers.host import describe_host

    return describe_host()


def same_code(executed: Path, notebook: Path) -> bool:
    """Whether a kept run executed this notebook's code: a run of an edited notebook, or of another guard's
    mutation, must not stand in for it (papermill's injected parameters aside)."""
    import nbformat

    def code(path: Path) -> list[str]:
        nb = nbformat.read(str(path), as_version=4)
        return [c.source for c in nb.cells
                if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])]

    return code(executed) == code(notebook)


def run_variant(
    notebook: Path, variant: str, out_dir: Path, reuse: bool = False, tag: str = ""
) -> dict[str, Any]:
    """Execute `notebook` at its defaults under `variant`, recording its results without comparing them."""
    env, params = variant_setup(variant)
    out = out_dir / f"{notebook.stem}-{variant}{tag}.ipynb"
    if reuse and out.exists() and same_code(out, notebook):  # a kept run (--keep) of this very code
        measured, error = reference_values(out), _recorded_error(out)
        if measured or error:
            results = measured["measured"] if measured and not error else None
            return {"variant": variant, "seconds": None, "error": error, "results": results}
    from helpers.gallery.execute import execute_notebook

    start = time.perf_counter()
    error = None
    measuring = {REFERENCE_MODE_ENV: "measure", tracking.ENV_SWITCH: "off"}
    with temporary_environ({**with_own_inductor_cache(env), **measuring}):
        try:
            execute_notebook(notebook, out, params, timeout=1800)
        except Exception as e:  # a failing bar is a finding too: report it, keep measuring the others
            error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
    measured = reference_values(out) if out.exists() else None
    return {
        "variant": variant,
        "seconds": round(time.perf_counter() - start, 1),
        "error": error,
        "results": (measured or {}).get("measured") if not error else None,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="notebook names or numbers (01, 02_ddp_retinanet, ...)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--fit", metavar="VARIANTS", help="comma-separated variants to run and fit on")
    mode.add_argument("--validate", metavar="VARIANTS", help="comma-separated held-out variants")
    mode.add_argument("--guard", action="store_true", help="run the file's named regression")
    mode.add_argument("--table", action="store_true", help="print the files' validation table")
    parser.add_argument("--report-only", metavar="STATISTICS",
                        help="with --fit: statistics to show but not compare (too wide to guard anything)")
    parser.add_argument("--fresh", action="store_true", help="with --fit: drop the file's earlier runs")
    parser.add_argument("--write", action="store_true", help="write notebooks/references/<notebook>.json")
    parser.add_argument("--keep", help="keep the executed notebooks in this folder")
    parser.add_argument("--reuse", action="store_true", help="with --keep: reuse runs executed there")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from helpers.gallery.runner import discover

    # none named: every notebook with a reference file (00, the launcher's tour, trains nothing and has none)
    notebooks = discover(args.notebooks) if args.notebooks else [
        nb for nb in discover([]) if (REFERENCES_DIR / f"{nb.stem}.json").exists()]
    if args.table:
        text, ok = validation_table([nb.stem for nb in notebooks])
        print(text)
        if args.write:
            write_docs_table(text)
        return 0 if ok else 1
    variants = [v.strip() for v in (args.fit or args.validate or "").split(",") if v.strip()]
    for v in variants:
        variant_setup(v)  # unknown names fail here, before anything runs
    out_dir = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="reference-spread-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    host = machine()
    print(f"machine: {host}", flush=True)
    status = 0
    for notebook in notebooks:
        path = REFERENCES_DIR / f"{notebook.stem}.json"
        reference = json.loads(path.read_text()) if path.is_file() else {}
        if not args.fit and reference.get("format") != FORMAT:
            raise SystemExit(f"{path} holds no fit to validate or guard: run --fit first")
        if args.guard:
            status |= _guard(notebook, reference, out_dir, host, args)
        else:
            runs, failed = _run_variants(notebook, variants, out_dir, host, args.reuse)
            status |= failed
            if args.fit:
                reference = _refit(notebook, reference, runs, out_dir, args)
            else:
                status |= _validate(reference, runs)
        if args.write:
            REFERENCES_DIR.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(reference, indent=1) + "\n")
            print(f"wrote {path.relative_to(ROOT)}")
    return status


def _run_variants(notebook: Path, variants: list[str], out_dir: Path, host: str,
                  reuse: bool) -> tuple[list[dict[str, Any]], bool]:
    """A run of the notebook under each variant on this machine, and whether one of them failed."""
    runs, failed = [], False
    for variant in variants:
        run = run_variant(notebook, variant, out_dir, reuse=reuse)
        run["machine"] = host
        runs.append(run)
        took = "reused" if run["seconds"] is None else f"{run['seconds']:>6.1f} s"
        failed_text = f"FAILED {run['error']}" if run["error"] else ""
        print(f"{notebook.stem} {variant:>14}: {took} {failed_text}", flush=True)
        failed |= bool(run["error"])
    return runs, failed


def _not_rerun(earlier: list[dict[str, Any]], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The earlier runs that `runs` do not replace: a variant run again on a machine replaces its earlier
    run there."""
    rerun = {(r["machine"], r["variant"]) for r in runs}
    return [r for r in earlier if (r["machine"], r["variant"]) not in rerun]


def _refit(notebook: Path, reference: dict[str, Any], runs: list[dict[str, Any]], out_dir: Path,
           args: argparse.Namespace) -> dict[str, Any]:
    """The reference file fitted again on `runs` and the file's earlier fitting runs (none with --fresh)."""
    runs = _not_rerun([] if args.fresh else reference.get("fit", {}).get("runs", []), runs) + runs
    report_only = (args.report_only.split(",") if args.report_only is not None
                   else reference.get("fit", {}).get("report_only", []))
    fitted = fit(runs, report_only=[r for r in report_only if r])
    params = _parameters(notebook, out_dir, reference)
    reference = {"notebook": notebook.stem, "format": FORMAT, "parameters": params, **fitted,
                 "fit": {"report_only": report_only, "runs": runs}, "validation": {"runs": []},
                 **({"guard": reference["guard"]} if "guard" in reference else {})}
    _print_fit(notebook.stem, reference)
    return reference


def _validate(reference: dict[str, Any], runs: list[dict[str, Any]]) -> bool:
    """Judge the held-out runs against the fit and add them to the file's validation runs; whether one
    failed."""
    repeats = [r for r in runs if repeats_a_fitting_run(reference, r)]
    for run in repeats:  # the same arithmetic as a fitting run (another session, same CPU type)
        print(f"  {run['variant']:>14}: not held out: it repeats a fitting run to the last digit")
    held_out = [r for r in runs if r not in repeats]
    failed = False
    for run in held_out:
        if not run["results"]:
            continue
        verdict = judge(reference, run["results"])
        failed |= not verdict["passed"]
        print(f"  {run['variant']:>14}: worst {verdict['worst']} at {verdict['share']:.2f} of "
              f"its tolerance: {'passes' if verdict['passed'] else 'FAILS'}")
    validation = reference.setdefault("validation", {"runs": []})
    validation["runs"] = _not_rerun(validation["runs"], runs) + held_out
    return failed


def _recorded_error(path: Path) -> str | None:
    """The error a kept notebook stopped with (papermill stores it as the failing cell's output), if any."""
    error = first_error(path)
    if error is None:
        return None
    return f"PapermillExecutionError: cell {error['cell']}: {error['ename']}: {(error['evalue'] or '')[:300]}"


def write_docs_table(table: str) -> None:
    """Put the table between the markers of docs/reference-check.md (the test holds the page to the files)."""
    page = ROOT / "docs" / "reference-check.md"
    text = page.read_text()
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    atomic_write(page, text[:start] + "\n" + table + "\n" + text[end:])
    print(f"wrote the table into {page.relative_to(ROOT)}")


def _parameters(notebook: Path, out_dir: Path, reference: dict[str, Any]) -> dict:
    """The default parameters the runs used, as the notebook recorded them (seed as the default's)."""
    for out in sorted(out_dir.glob(f"{notebook.stem}-*.ipynb")):
        found = reference_values(out)
        if found and found.get("params"):
            from helpers.gallery.execute import notebook_parameters

            return {**found["params"], "seed": notebook_parameters(notebook)["seed"]}
    if reference.get("parameters"):
        return reference["parameters"]
    raise SystemExit(f"{notebook.stem}: no run recorded its parameters")


def _print_fit(stem: str, reference: dict[str, Any]) -> None:
    promise = reference["promise"]
    print(f"\n{stem}: {promise['fit_runs']} runs, k = {promise['k']:.2f} "
          f"({promise['per_statistic']:.2g} per statistic)")
    for group in ("compared", "not_compared"):
        for name, spec in reference[group].items():
            print(f"  {name:<36} {spec['value']:>10.4g} ± {spec['abs']:<8.3g} (sd {spec['sd']:.3g})"
                  f"{'' if group == 'compared' else '  (shown, not compared)'}")


def _guard(
    notebook: Path, reference: dict[str, Any], out_dir: Path, host: str, args: argparse.Namespace
) -> int:
    """Run the file's named regression; it must pass the notebook's bars and fail the reference check."""
    import nbformat

    guard = reference.get("guard")
    if not guard:
        raise SystemExit(f"{notebook.stem}'s reference file names no regression to guard against ('guard')")
    nb = nbformat.read(str(notebook), as_version=4)
    hits = [c for c in nb.cells if c.cell_type == "code" and guard["original"] in c.source]
    if len(hits) != 1 or hits[0].source.count(guard["original"]) != 1:
        raise SystemExit(f"{notebook.stem}: the guard's line is not in the notebook exactly once; update it")
    hits[0].source = hits[0].source.replace(guard["original"], guard["mutated"])
    folder = Path(tempfile.mkdtemp(prefix="guard-"))
    mutated = folder / notebook.name
    nbformat.write(nb, str(mutated))
    run = run_variant(mutated, "native", out_dir, reuse=args.reuse, tag="-guard")
    run["machine"] = host
    if not run["results"]:
        print(f"{notebook.stem}: {guard['regression']}: the notebook's bars caught it ({run['error']}); "
              "a guard must be subtler")
        return 1
    verdict = judge(reference, run["results"])
    caught = "NOT caught" if verdict["passed"] else "caught by the reference check"
    if verdict["passed"] and not guard.get("too_wide"):
        print(f"{notebook.stem}: not caught: name a regression it catches, or say in the file's guard "
              "'too_wide' why none subtle enough for the bars to miss is caught")
    print(f"{notebook.stem}: {guard['regression']}: bars pass; worst {verdict['worst']} at "
          f"{verdict['share']:.2f} of its tolerance: {caught}")
    guard["runs"] = [run]
    return int(verdict["passed"] and not guard.get("too_wide"))


if __name__ == "__main__":
    raise SystemExit(main())
