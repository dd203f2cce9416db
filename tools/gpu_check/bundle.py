"""Installing the carried wheels (gpu-bundle/, made by tools/gpu_bundle.py): only those whose distribution
this Python lacks, from the folder only, into `--site`, so the machine's own torch, transformers... are the
ones tested."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from helpers.paths import ROOT

DEFAULT_BUNDLE = ROOT / "gpu-bundle"
DEFAULT_SITE = Path(tempfile.gettempdir()) / "gpu-check-site"


def distribution_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_bundle(bundle: Path, site: Path) -> dict[str, Any]:
    """Install the bundle's wheels whose distribution this Python lacks into `site`, from the folder only."""
    manifest_path = bundle / "manifest.json"
    if not manifest_path.is_file():
        return {"bundle": str(bundle), "installed": [], "already_present": {},
                "error": f"no {manifest_path}: build it with `make gpu-bundle` and carry gpu-bundle/"}
    manifest = json.loads(manifest_path.read_text())
    present, wanted = {}, []
    for wheel in manifest["wheels"]:
        version = distribution_version(wheel["name"])
        if version is None:
            wanted.append(wheel)
        else:
            present[wheel["name"]] = version
    info: dict[str, Any] = {"bundle": str(bundle), "site": str(site), "installed": [],
                            "already_present": present}
    if not wanted:
        return info
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--disable-pip-version-check", "--quiet", "--target", str(site),
           *[str(bundle / w["file"]) for w in wanted]]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    info["install_seconds"] = round(time.monotonic() - start, 1)
    if proc.returncode:
        info["error"] = f"pip install failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-2000:]}"
        return info
    info["installed"] = [f"{w['name']}=={w['version']}" for w in wanted]
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    return info

