"""The gallery's one command line: run notebooks (the default), list them, rebuild a report, compare two
runs, store outputs, or print the scale-up commands.

    python -m helpers.gallery                              # every notebook, default parameters
    python -m helpers.gallery 01 04 -p processes=8         # by number or name; a parameter for all
    python -m helpers.gallery -p 04_fsdp_transformer:steps=5000 -p epochs=3
    python -m helpers.gallery --baseline runs/<stamp>      # run, then compare with an earlier run
    python -m helpers.gallery --list                       # the notebooks and their parameters
    python -m helpers.gallery --compare runs/<A> runs/<B>  # which metrics moved; exit 1 on a regression
    python -m helpers.gallery --report runs/<stamp>        # (re)build a run folder's HTML report
    python -m helpers.gallery --store 01 04                # re-execute at defaults, store outputs in place
    python -m helpers.gallery --scale-up 04                # the notebook's full-size command

Exit status: 0 when everything asked for passed; 1 when a notebook failed or a metric regressed; 2 when
the command line is refused (the message says what to change). Everything is checked before the first
notebook starts. Listing, comparing and reporting import no torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from helpers.gallery.errors import GalleryError, exits_on_gallery_error
from helpers.paths import NOTEBOOKS_DIR, ROOT

MODES = ("list", "compare", "report", "store", "scale_up")


def parser() -> argparse.ArgumentParser:
    from helpers.gallery.compare import add_compare_arguments

    p = argparse.ArgumentParser(prog="python -m helpers.gallery", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("notebooks", nargs="*", help="names, stems or numbers (default: all)")
    p.add_argument("-p", "--parameter", action="append", default=[], metavar="[NB:]NAME=VALUE")
    p.add_argument("--notebooks-dir", default=str(NOTEBOOKS_DIR), help="where the notebooks are")
    p.add_argument("--runs-dir", default=str(ROOT / "runs"), help="where run folders go")
    p.add_argument("--timeout", type=int, default=1800, help="seconds a cell may run")
    p.add_argument("--no-progress", action="store_true", help="do not show the running cell")
    p.add_argument("--no-report", action="store_true", help="no HTML rendering or index.html")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow store (default: $GALLERY_TRACKING_URI, $MLFLOW_TRACKING_URI, else "
                        "sqlite:///<run folder>/mlflow.db)")
    p.add_argument("--no-tracking", action="store_true", help="no MLflow tracking")
    p.add_argument("--baseline", metavar="RUN_OR_JSON",
                   help="after the run, compare with this run folder or baseline JSON")
    modes = p.add_argument_group("other modes (one at a time; each runs instead of the gallery)")
    modes.add_argument("--list", action="store_true", help="list notebooks and their parameters")
    modes.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                       help="compare two run folders (or baseline JSON files)")
    modes.add_argument("--report", metavar="RUN_DIR", help="(re)build the HTML report of a run folder")
    modes.add_argument("--store", action="store_true",
                       help="re-execute the notebooks at their defaults and store the outputs in place (what "
                            "nbval compares); a failed run leaves the stored file as it was (its executed "
                            "copy: runs/store-failures/)")
    modes.add_argument("--scale-up", action="store_true",
                       help="print each notebook's full-size command, as its 'Scaling up' section gives it")
    add_compare_arguments(p)
    return p


@exits_on_gallery_error
def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    chosen = [m for m in MODES if getattr(args, m)]
    if len(chosen) > 1:
        given = " and ".join("--" + m.replace("_", "-") for m in chosen)
        raise GalleryError(f"{given}: give one mode at a time")
    if args.compare:
        from helpers.gallery.compare import run_compare

        return run_compare(*args.compare, args.tolerance, args.abs_tolerance, args.timings, args.direction)
    if args.report:
        from helpers.gallery.report import build_report

        print(build_report(args.report))
        return 0

    from helpers.gallery.runner import discover

    notebooks_dir = Path(args.notebooks_dir)
    notebooks = discover(args.notebooks, notebooks_dir)
    if not notebooks:
        raise GalleryError(f"no notebooks found in {notebooks_dir}")
    if args.list:
        from helpers.gallery.execute import notebook_parameters

        for nb in notebooks:
            print(nb.stem, notebook_parameters(nb))
        return 0
    if args.scale_up:
        from helpers.gallery.scale_up import SCALE_UPS, command

        for nb in notebooks:
            if nb.stem in SCALE_UPS:
                print(f"# {nb.stem} ({SCALE_UPS[nb.stem].where})\n{command(nb.stem)}\n")
        return 0
    if args.store:
        from helpers.gallery.execute import store_outputs

        if args.parameter:
            raise GalleryError("--store runs the notebooks at their defaults (what nbval compares): drop -p.")
        for nb in notebooks:
            print(f"executing {nb.name} and storing its outputs", flush=True)
            store_outputs(nb, timeout=args.timeout)
        return 0
    return run(args, notebooks)


def run(args: argparse.Namespace, notebooks: list[Path]) -> int:
    from helpers import tracking
    from helpers.gallery.compare import run_compare
    from helpers.gallery.runner import new_run_dir, parse_overrides, run_gallery
    from helpers.host import host_info

    overrides = parse_overrides(args.parameter, notebooks)
    if args.baseline and not Path(args.baseline).exists():
        raise GalleryError(f"--baseline {args.baseline}: no such run folder or JSON file")

    run_dir = new_run_dir(Path(args.runs_dir))
    if args.no_tracking or not tracking.enabled():
        tracking_uri = None
    else:
        tracking_uri = (args.tracking_uri or os.environ.get(tracking.ENV_URI)
                        or os.environ.get("MLFLOW_TRACKING_URI")
                        or tracking.sqlite_uri(run_dir / tracking.DB_NAME))
    host = host_info()
    print(f"gallery run {run_dir} on {host['cpus']} CPUs, {host['gpus']} GPU(s); "
          f"report: {run_dir / 'index.html'}", flush=True)
    results = run_gallery(notebooks, overrides, run_dir, args.timeout, progress=not args.no_progress,
                          tracking_uri=tracking_uri, report=not args.no_report, host=host)
    print((run_dir / "summary.md").read_text())
    if tracking_uri:
        print(f"MLflow: mlflow ui --backend-store-uri {tracking_uri}")
    status = 0 if all(r.status == "passed" for r in results) else 1
    if args.baseline:
        status |= run_compare(args.baseline, str(run_dir), args.tolerance, args.abs_tolerance, args.timings,
                              args.direction)
    return status


if __name__ == "__main__":
    sys.exit(main())
