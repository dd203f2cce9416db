"""What each nbval variant (tests/plugins/nbval_variants.py) costs on this machine, per training step.

nbval runs every notebook once, under an instruction set and a thread count that did not store its
outputs. Both change the speed a lot on a small machine; this prints by how much, so the variants can be
given to the notebooks where they cost least:

* a small conv net (torchvision's MobileNetV3, 4 images of 96 px, as notebook 02's backbone) under this
  machine's kernels, AVX2, and the no-SIMD baseline, 1 thread;
* an MLP step in 2 processes at once (2 ranks), each with 1 and with 4 intra-op threads.

    python benchmarks/nbval_variant_cost.py [--markdown FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.env import ISA_AVX2, ISA_BASELINE  # noqa: E402

ISAS = {"native": {}, "AVX2": ISA_AVX2, "baseline": ISA_BASELINE}

# One training step of `net` on `x`, timed after a warm-up; threads from argv. Milliseconds a step.
TIMED = """
import sys, time, torch, torchvision
torch.set_num_threads(int(sys.argv[1])); torch.manual_seed(0)
net, x = {model}
opt = torch.optim.SGD(net.parameters(), lr=0.01)
def step():
    opt.zero_grad(); net(x).sum().backward(); opt.step()
for _ in range({warmup}): step()
t = time.perf_counter()
for _ in range({steps}): step()
print((time.perf_counter() - t) / {steps} * 1000)
"""
CONV = TIMED.format(model="torchvision.models.mobilenet_v3_large(num_classes=10), torch.randn(4, 3, 96, 96)",
                    warmup=3, steps=15)
MLP = TIMED.format(model="torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)]), "
                         "torch.randn(64, 256)", warmup=20, steps=300)


def run(code: str, env: dict[str, str], *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", code, *args], env={**os.environ, **env}, check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    args = parser.parse_args()
    base = {"OMP_WAIT_POLICY": "PASSIVE"}
    native = None
    lines = ["Conv net step (MobileNetV3, 4 x 96 px, 1 thread):", "",
             "| kernels | ms a step | / native |", "|---|---:|---:|"]
    for name, env in ISAS.items():
        ms = run(CONV, {**base, **env}, "1")
        native = native or ms
        lines.append(f"| {name} | {ms:.1f} | {ms / native:.2f}x |")
    lines += ["", "MLP step, 2 processes at once (the slower of the two):", "",
              "| threads per process | ms a step | / 1 thread |", "|---:|---:|---:|"]
    one = None
    for threads in ("1", "4"):
        procs = [subprocess.Popen([sys.executable, "-c", MLP, threads], env={**os.environ, **base},
                                  stdout=subprocess.PIPE, text=True) for _ in range(2)]
        ms = max(float(p.communicate()[0].strip()) for p in procs)
        one = one or ms
        lines.append(f"| {threads} | {ms:.2f} | {ms / one:.2f}x |")
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
