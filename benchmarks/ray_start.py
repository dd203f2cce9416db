"""What a Ray Train run costs before and after the training function: the gallery's fixed Ray overhead.

Each `TorchTrainer.fit()` starts a worker group (controller actor, one actor per worker, the torch process
group) before the training function runs, and tears it down after. On 2 CPU cores that fixed cost, not the
training, dominates notebook 06 and the Ray launcher tests, so it is measured here on its own: the time
to start a private instance, then for each of several `fit()` calls of a function that only stamps the
clock, the time until every worker has started the function (start) and until `fit()` returns (total).

    python benchmarks/ray_start.py [--fits 3] [--workers 2] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def _loop(config: dict) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["stamps"], str(rank)), "w") as f:
        f.write(str(time.time()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fits", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--markdown", help="also write the report to this file (benchmarks/write_docs.py)")
    args = parser.parse_args()
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")

    from helpers.launch.ray_instance import ray_session

    t0 = time.perf_counter()
    with ray_session("ray"):
        figures: dict = {"instance_start_s": round(time.perf_counter() - t0, 1), "fits": []}
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer

        for i in range(args.fits):
            storage = tempfile.mkdtemp(prefix="ray-start-")
            stamps = tempfile.mkdtemp(prefix="ray-start-stamps-")
            trainer = TorchTrainer(_loop, train_loop_config={"stamps": stamps},
                                   scaling_config=ScalingConfig(num_workers=args.workers),
                                   torch_config=TorchConfig(backend="gloo"),
                                   run_config=RunConfig(name=f"start{i}", storage_path=storage))
            start = time.time()
            trainer.fit()
            total = time.time() - start
            first = max(float(stamp.read_text()) for stamp in Path(stamps).iterdir()) - start
            figures["fits"].append({"until_function_s": round(first, 1), "fit_total_s": round(total, 1)})
        print(json.dumps(figures))
    shutdown = time.perf_counter() - t0
    print(f"shutdown done at {shutdown:.1f} s")
    lines = [f"A private Ray instance, then {args.fits} `TorchTrainer.fit()` calls of {args.workers} workers "
             "each (a function that only stamps the clock).", "",
             "| step | seconds |", "|---|---:|", f"| start the instance | {figures['instance_start_s']} |"]
    for i, fit in enumerate(figures["fits"], 1):
        lines += [f"| fit {i}: until every worker runs the function | {fit['until_function_s']} |",
                  f"| fit {i}: until `fit()` returns | {fit['fit_total_s']} |"]
    lines.append(f"| all of it, shutdown included | {shutdown:.1f} |")
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
