"""Training throughput under each launcher: the same DDP loop, 2 CPU processes, a fixed number of steps.

The loop (an MLP under DistributedDataParallel with gloo, rank 0 printing a line every few steps and
drawing a progress_bar) runs under `helpers.distributed` on this machine, under
`helpers.distributed(cluster="ray")` (Ray Train workers, in one private Ray instance for every round),
and under `torchrun`. Each rank times its own steps between two barriers, after a warm-up, so start-up
costs are left out: what is compared is what a launcher costs a running training loop (its log relay,
its progress relay, the threads it gives each rank). Launchers take turns, round after round, and each
figure is the median over the rounds, so a machine that gets busier for a while slows all of them.

    python benchmarks/launcher_throughput.py [--rounds 5] [--steps 300] [--no-ray] [--markdown FILE]

The ratios printed last are steps/s of each launcher over torchrun's, measured in this one run; the
local launcher should stay at 0.97 or more.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROCESSES = 2
WIDTH = 512
BATCH = 64


def train(steps: int, warmup: int, log_every: int) -> dict[str, float]:
    """The DDP loop every launcher runs; returns this rank's steps per second over the timed steps.

    Two figures: from the total time (what a run takes), and from the median step (robust to a burst of
    other work on a shared machine: every step waits for the slower rank, so a burst slows a few steps).
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from helpers import progress_bar, worker_context

    ctx = worker_context()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.ReLU(),
                                    torch.nn.Linear(2 * WIDTH, 2 * WIDTH), torch.nn.ReLU(),
                                    torch.nn.Linear(2 * WIDTH, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(BATCH, WIDTH, generator=generator)
    y = torch.randint(0, 10, (BATCH,), generator=generator)
    ends: list[float] = []
    for step in progress_bar(range(warmup + steps), desc="steps", unit="step"):
        if step == warmup:
            dist.barrier()
            ends.append(time.perf_counter())
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % log_every == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step >= warmup:
            ends.append(time.perf_counter())
    dist.barrier()
    dist.destroy_process_group()
    durations = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {"total": steps / (ends[-1] - ends[0]), "median": 1 / statistics.median(durations)}


def run_helpers(args: argparse.Namespace, cluster: str | None) -> dict[str, float]:
    from helpers import distributed

    fn = distributed(processes=PROCESSES, device="cpu", cluster=cluster, progress=True)(train)
    return fn.distributed(args.steps, args.warmup, args.log_every)[0]


# torchrun runs as from the shell this script was started in: helpers.distributed sets OMP_WAIT_POLICY in
# its own process (for its forkserver), which a later torchrun must not inherit.
SHELL_ENV = dict(os.environ)


def run_torchrun(args: argparse.Namespace, out: Path) -> dict[str, float]:
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", f"--nproc-per-node={PROCESSES}", __file__, "--worker",
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--log-every", str(args.log_every),
               "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=600, env=SHELL_ENV)
    return json.loads(out.read_text())


def worker(args: argparse.Namespace) -> None:
    """A torchrun rank: run the loop, rank 0 writes its rate."""
    rate = train(args.steps, args.warmup, args.log_every)  # a dict of two rates
    if os.environ.get("RANK") == "0":
        Path(args.out).write_text(json.dumps(rate))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--no-ray", action="store_true", help="leave the Ray launcher out")
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    import contextlib

    from helpers.launch import ray_session

    rates: dict[str, list[dict[str, float]]] = {"torchrun": [], "helpers.distributed": []}
    if not args.no_ray:
        rates['helpers.distributed(cluster="ray")'] = []
    with tempfile.TemporaryDirectory() as tmp, \
            (contextlib.nullcontext() if args.no_ray else ray_session("ray", num_cpus=PROCESSES)):
        for i in range(args.rounds):
            rates["torchrun"].append(run_torchrun(args, Path(tmp) / f"rate{i}.json"))
            rates["helpers.distributed"].append(run_helpers(args, None))
            if not args.no_ray:
                rates['helpers.distributed(cluster="ray")'].append(run_helpers(args, "ray"))
            print(f"round {i + 1}/{args.rounds} (median-step steps/s): "
                  + ", ".join(f"{name} {runs[-1]['median']:.1f}" for name, runs in rates.items()),
                  file=sys.stderr)
    median = {name: {kind: statistics.median(r[kind] for r in runs) for kind in ("median", "total")}
              for name, runs in rates.items()}
    base = median["torchrun"]
    wait_policy = SHELL_ENV.get("OMP_WAIT_POLICY", "unset")
    lines = [f"DDP training loop, {PROCESSES} CPU processes (gloo), {args.steps} timed steps, median of "
             f"{args.rounds} rounds; torchrun's OMP_WAIT_POLICY: {wait_policy}.", "",
             f"| {'launcher':<34} | {'steps/s (median step)':>21} | {'/ torchrun':>10} | "
             f"{'steps/s (total time)':>20} | {'/ torchrun':>10} |",
             f"|{'-' * 36}|{'-' * 22}:|{'-' * 11}:|{'-' * 21}:|{'-' * 11}:|"]
    for name, m in median.items():
        lines.append(f"| {name:<34} | {m['median']:>21.1f} | {m['median'] / base['median']:>10.3f} | "
                     f"{m['total']:>20.1f} | {m['total'] / base['total']:>10.3f} |")
    lines.append("")
    for name, m in median.items():
        if name != "torchrun":
            ratio = m["median"] / base["median"]
            target = (f"target >= 0.97: {'met' if ratio >= 0.97 else 'missed'}" if "cluster" not in name
                      else "no target: Ray's workers are another launcher")
            lines.append(f"- {name} / torchrun: {ratio:.3f} (median step; {target})")
    report = "\n".join(lines).rstrip()
    print("\n" + report)
    if args.markdown:
        Path(args.markdown).write_text(report + "\n")


if __name__ == "__main__":
    main()
