"""Set-up time of the gallery's environment: uv against pip, the same lock, on this machine, in one run.

Each installer builds a fresh virtual environment from requirements.lock (plus the helpers package,
editable) with tools/build_venv.py, starting from an empty package cache (uv: a new UV_CACHE_DIR; pip:
PIP_NO_CACHE_DIR=1), which is what a fresh machine or a CI runner pays. Both environments are then
checked to hold the same packages at the same versions (`pip freeze`-style listing).

    python benchmarks/setup_time.py [--only uv|pip] [--keep DIR] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def folder_size(folder: Path) -> int:
    """Bytes on disk of a folder's files (hard links counted once)."""
    seen, total = set(), 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_blocks * 512
    return total


def build(installer: str, where: Path) -> tuple[float, dict[str, str], int]:
    venv = where / f"venv-{installer}"
    env = dict(os.environ, UV_CACHE_DIR=str(where / "uv-cache"), PIP_NO_CACHE_DIR="1")
    env.pop("VIRTUAL_ENV", None)
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "build_venv.py"),
            "--venv",
            str(venv),
            "--installer",
            installer,
            "--lock",
            str(ROOT / "requirements.lock"),
            "--editable",
            str(ROOT),
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - start
    listing = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; "
            'print(\'\\n\'.join(sorted(f\'{d.metadata["Name"].lower().replace("_", "-")}=='
            "{d.version}' for d in m.distributions())))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    packages = dict(line.split("==", 1) for line in listing)
    for tool in ("pip", "setuptools", "uv", "wheel"):  # the installers themselves differ, by design
        packages.pop(tool, None)
    return seconds, packages, folder_size(venv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=("uv", "pip"))
    parser.add_argument("--keep", help="build the environments in this folder and keep them")
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    args = parser.parse_args(argv)
    where = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="setup-time-"))
    where.mkdir(parents=True, exist_ok=True)
    results = {}
    try:
        for installer in [args.only] if args.only else ["uv", "pip"]:
            seconds, packages, size = build(installer, where)
            results[installer] = (seconds, packages, size)
            print(f"{installer:>4}: {seconds:6.1f} s, {len(packages)} packages, {size / 1e9:.1f} GB",
                  flush=True)
        lines = ["From requirements.lock, an empty package cache each; the environment's size on disk.", "",
                 "| installer | seconds | packages | disk (GB) |", "|---|---:|---:|---:|"]
        lines += [f"| {name} | {seconds:.1f} | {len(packages)} | {size / 1e9:.1f} |"
                  for name, (seconds, packages, size) in results.items()]
        if len(results) == 2:
            (uv_s, uv_p, _), (pip_s, pip_p, _) = results["uv"], results["pip"]
            differ = sorted(k for k in set(uv_p) | set(pip_p) if uv_p.get(k) != pip_p.get(k))
            lines += ["", f"pip / uv: {pip_s / uv_s:.1f}x; same packages and versions: {not differ}"
                      + (f" (differ: {differ[:10]})" if differ else "")]
            print(lines[-1])
        if args.markdown:
            Path(args.markdown).write_text("\n".join(lines) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(where, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
