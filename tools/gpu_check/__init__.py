"""One GPU check: every notebook's GPU path for a few steps, on a GPU machine without a package index.

    python tools/gpu_check --out DIR                  # on the GPU machine (make gpu-check)
    python tools/gpu_check --device cpu --only 05     # the same machinery on CPU, with CPU expectations

On the GPU machine, with this working tree and gpu-bundle/ (which `make gpu-bundle` fills where PyPI is
reachable) copied there, one command runs the whole check within `--budget-s` (580 s by default;
`--time-scale` stretches every limit for a slower machine):

  set -o pipefail; PYTHONUNBUFFERED=1 python3 tools/gpu_check --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"

What it does, in order, stopping early only where nothing else could work:
1. Preflight: imports torch and, for `--device cuda` (the default), checks `torch.cuda.is_available()`; if
   not, it says what it saw (torch build, CUDA_VISIBLE_DEVICES, nvidia-smi) and exits 2 before anything
   expensive.
2. Installs the carried wheels (`gpu-bundle/`, made by tools/gpu_bundle.py) that this Python lacks, with
   pip, from the folder only (`--no-index --no-deps`), into `--site` (a folder put first on PYTHONPATH for
   the check and every kernel it starts), so the machine's own torch, transformers... are the ones used.
3. Records the versions it runs with (Python, torch, CUDA, cuDNN, NCCL, the GPU and driver, transformers,
   TRL, DeepSpeed, Lightning...) and whether the private torch APIs the launcher uses are still there.
4. Executes each notebook with papermill (in a subprocess, with a wall-clock limit per notebook, all of
   them within `--budget-s`) at a few steps with `processes=1`, in its own kernel, so a notebook that
   fails, hangs or crashes does not stop the others. One GPU cannot hold 2 ranks, so the notebooks' 2-rank
   proofs run where each notebook sends them (2 CPU processes, or 1 GPU rank): the report says so per
   notebook. A notebook that needs what cannot be carried (06: Ray) is reported `skipped: <reason>`.
5. Reads what each notebook recorded (`record_metrics`) and asserts the run really used the device:
   device "cuda", backend "nccl", precision "bf16" where `torch.cuda.is_bf16_supported()` (else "fp16"),
   a peak GPU memory above 0 and a throughput above 0 (with `--device cpu`: "cpu", "gloo", "fp32").
6. Prints a table (notebook, status, seconds, peak GPU MB, throughput, what was skipped and why) and writes
   it to `--out` as report.json and report.md, with the executed notebooks and their logs as
   notebooks.tar.gz. Exit status: 0 when every notebook passed or was skipped for a stated reason, 1 when
   one failed or timed out, 2 when the preflight failed.

The package, by step: `cli` (the options, `main`), `environment` (the preflight, the versions, each
kernel's environment), `bundle` (installing the carried wheels), `checks` (each notebook's check, read from
helpers/gallery/catalog.py), `runner` (every check within the budget), `executor` (one notebook under
papermill, killed at its limit), `metrics` (what the recorded metrics must say), `report` (the table,
report.json/.md, notebooks.tar.gz) and `publish` (docs/gpu-check.md from the kept reports).
"""

import sys
from pathlib import Path

# Run as `python tools/gpu_check` on a machine where `helpers` is not installed: this checkout's helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
