"""Training throughput under each launcher: the same DDP loop, 2 CPU processes, a fixed number of steps.

The loop (an MLP under DistributedDataParallel with gloo, rank 0 printing a line every few steps and
drawing a progress_bar) runs under `helpers.distributed` on this machine, under
`helpers.distributed(cluster="ray")` (Ray Train workers, in one private Ray instance for every round),
and under `torchrun`. Each rank times its own steps between two barriers, after a warm-up, so start-up
costs are left out: what is compared is what a launcher costs a running training loop (its log relay,
its progress relay, the threads it gives each rank). Launchers take turns, round after round, and each
figure is the median over the rounds, so a machine that gets busier for a while slows all of them.

    python benchmarks/launcher_throughput.py [--rounds 5] [--steps 300] [--no-ray]

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


def train(steps: int, warmup: int, log_every: int) -> float:
    """The DDP loop every launcher runs; rank 0 returns its steps per second over the timed steps."""
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
    start = 0.0
    for step in progress_bar(range(warmup + steps), desc="steps", unit="step"):
        if step == warmup:
            dist.barrier()
            start = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % log_every == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    rate = steps / (time.perf_counter() - start)
    dist.destroy_process_group()
    return rate


def run_helpers(args: argparse.Namespace, cluster: str | None) -> float:
    from helpers import distributed

    fn = distributed(processes=PROCESSES, device="cpu", cluster=cluster, progress=True)(train)
    return fn.distributed(args.steps, args.warmup, args.log_every)[0]


def run_torchrun(args: argparse.Namespace, out: Path) -> float:
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--standalone", f"--nproc-per-node={PROCESSES}", __file__, "--worker",
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--log-every", str(args.log_every),
               "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    return json.loads(out.read_text())


def worker(args: argparse.Namespace) -> None:
    """A torchrun rank: run the loop, rank 0 writes its rate."""
    rate = train(args.steps, args.warmup, args.log_every)
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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    import contextlib

    from helpers.launch import ray_session

    rates: dict[str, list[float]] = {"torchrun": [], "helpers.distributed": []}
    if not args.no_ray:
        rates['helpers.distributed(cluster="ray")'] = []
    with tempfile.TemporaryDirectory() as tmp, \
            (contextlib.nullcontext() if args.no_ray else ray_session("ray", num_cpus=PROCESSES)):
        for i in range(args.rounds):
            rates["torchrun"].append(run_torchrun(args, Path(tmp) / f"rate{i}.json"))
            rates["helpers.distributed"].append(run_helpers(args, None))
            if not args.no_ray:
                rates['helpers.distributed(cluster="ray")'].append(run_helpers(args, "ray"))
            print(f"round {i + 1}/{args.rounds}: "
                  + ", ".join(f"{name} {values[-1]:.1f}" for name, values in rates.items()), file=sys.stderr)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\nDDP training loop, {PROCESSES} CPU processes (gloo), {args.steps} timed steps, "
          f"median of {args.rounds} rounds\n")
    print(f"| {'launcher':<34} | {'steps/s':>8} | {'/ torchrun':>10} |")
    print(f"|{'-' * 36}|{'-' * 10}|{'-' * 12}|")
    for name, rate in medians.items():
        print(f"| {name:<34} | {rate:>8.1f} | {rate / medians['torchrun']:>10.3f} |")
    local = medians["helpers.distributed"] / medians["torchrun"]
    print(f"\nhelpers.distributed / torchrun: {local:.3f} (target >= 0.97)")


if __name__ == "__main__":
    main()
