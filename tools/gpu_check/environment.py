"""The machine the check runs on: the preflight (is the device there?), the versions it records, and the
environment of each notebook's kernel (the carried wheels first on PYTHONPATH, this Python as the kernel,
nothing downloaded)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers.paths import ROOT

from .bundle import distribution_version

# The packages whose versions the report records (distribution names)
VERSIONS_OF = ("torch", "torchvision", "transformers", "tokenizers", "huggingface-hub", "accelerate", "trl",
               "datasets", "deepspeed", "lightning", "torchmetrics", "peft", "mosaicml-streaming",
               "pycocotools", "numpy", "pandas", "scikit-learn", "matplotlib", "pyarrow", "papermill",
               "nbclient", "ipykernel", "ray", "mlflow", "mlflow-skinny", "cloudpickle")


def write_kernelspec(root: Path) -> Path:
    """A `python3` kernel spec for this interpreter, found first through JUPYTER_PATH: papermill's kernel
    is then the Python that runs the check (with its PYTHONPATH), whatever kernels the machine has."""
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (gpu check)", "language": "python", "metadata": {"debugger": False}}))
    return root


def child_env(device: str, site: Path | None, jupyter_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(site)] if site and site.is_dir() else []
    paths += [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["JUPYTER_PATH"] = os.pathsep.join([str(jupyter_path), *[p for p in env.get("JUPYTER_PATH", "").split(
        os.pathsep) if p]])
    env["GALLERY_TRACKING"] = "off"  # no MLflow (not carried); record_metrics still records
    # Jupyter's, IPython's and matplotlib's own folders next to the kernel spec, whatever $HOME allows
    own_dirs = {"JUPYTER_RUNTIME_DIR": "runtime", "IPYTHONDIR": "ipython", "MPLCONFIGDIR": "mpl"}
    for name, folder in own_dirs.items():
        env.setdefault(name, str(jupyter_path / folder))
    # nothing is downloaded (no network there): fail at once rather than wait for a hub's time-out
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # "auto" then means CPU processes, as on a machine without GPUs
    return env


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in VERSIONS_OF:
        found[name] = distribution_version(name) or "missing"
    return found


def torch_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                            "cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info.update(
            name=torch.cuda.get_device_name(0), count=torch.cuda.device_count(),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
            bf16=torch.cuda.is_bf16_supported(), cudnn=torch.backends.cudnn.version(),
            nccl=".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None)
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            query = [smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
            out = subprocess.run(query, capture_output=True, text=True, timeout=30)
            info["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
        except (OSError, subprocess.SubprocessError) as e:
            info["nvidia_smi"] = f"failed: {e}"
    return info


def compat_problems() -> list[str]:
    """The launcher's private torch / standard-library APIs that are not where they were checked."""
    try:
        from helpers.launch import _compat
    except Exception as e:
        return [f"helpers.launch does not import: {type(e).__name__}: {e}"]
    problems = []
    for api in _compat.PRIVATE_APIS:
        if api.library == "ray":
            continue
        try:
            _compat.resolve(api)
        except Exception as e:
            problems.append(str(e))
    return problems


def preflight(device: str) -> str | None:
    """None when the device is usable; else what is wrong, in words a person can act on."""
    try:
        import torch
    except Exception as e:
        return f"torch does not import here ({type(e).__name__}: {e}): run with the Python that has torch."
    if device == "cpu" or torch.cuda.is_available():
        return None
    lines = [f"torch.cuda.is_available() is False: torch {torch.__version__} (built for CUDA "
             f"{torch.version.cuda or 'none: a CPU-only build'}), "
             f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!s}."]
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            lines.append(f"nvidia-smi -L: {(out.stdout or out.stderr).strip() or '(nothing)'}")
        except (OSError, subprocess.SubprocessError) as e:
            lines.append(f"nvidia-smi failed: {e}")
    else:
        lines.append("nvidia-smi is not on PATH: no NVIDIA driver here?")
    lines.append("Nothing was run. On a machine without a GPU, `--device cpu` checks the same machinery.")
    return "\n".join(lines)

