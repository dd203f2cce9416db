"""helpers.memory_plan's FSDP estimate against what FSDP2 `fully_shard` really allocates on each rank.

The gallery's GPT (notebook 04's model, helpers/models/gpt.py) is built on the meta device, each block and
then the whole model wrapped with `fully_shard`, materialised (`to_empty`), and trained one AdamW step, in
`world_size` CPU processes over gloo. Each rank then sums the bytes of its own shards: parameters, gradients
and optimizer moments. On CPU everything is fp32, as FSDP2's sharded master weights, gradients and moments are
under bf16 mixed precision on GPUs, so the estimate's figures apply unchanged. This prints both, per rank:

    python benchmarks/memory_plan_fsdp.py [--preset tiny] [--world-size 2]

tests/test_memory_plan.py runs `measure` at the tiny size and checks the estimate against it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rank(rank: int, world_size: int, preset: str, folder: str) -> None:
    """One rank: shard, materialise, one AdamW step, then the bytes of this rank's own shards."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from helpers.models.gpt import GPT, gpt_config, init_weights

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world_size)
    try:
        config = gpt_config(preset)
        with torch.device("meta"):
            model = GPT(config)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        model.to_empty(device="cpu")
        init_weights(model, seed=0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(rank)
        idx = torch.randint(config.vocab_size, (2, config.context + 1), generator=generator)
        logits = model(idx[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()).backward()
        optimizer.step()

        def nbytes(tensors) -> int:
            local = (t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None)
            return sum(t.nbytes for t in local)

        params = list(model.parameters())
        moments = [t for state in optimizer.state.values() for t in state.values()
                   if torch.is_tensor(t) and t.dim() > 0]   # "step" is a 0-dim counter, not state a parameter
        held = {"parameters": nbytes(params), "gradients": nbytes(p.grad for p in params),
                "optimizer": nbytes(moments)}
        Path(folder, f"rank{rank}.json").write_text(json.dumps(held))
    finally:
        dist.destroy_process_group()


def measure(preset: str = "tiny", world_size: int = 2) -> list[dict[str, int]]:
    """Bytes each rank holds after one FSDP2 step, by role, in rank order."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank, args=(world_size, preset, folder), nprocs=world_size, join=True)
        return [json.loads(Path(folder, f"rank{r}.json").read_text()) for r in range(world_size)]


def main() -> int:
    from helpers.memory_plan import count_parameters, model_state_bytes
    from helpers.models.gpt import gpt_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    counts = count_parameters(gpt_config(args.preset))
    estimate = model_state_bytes(counts, "fsdp", args.world_size)
    held = measure(args.preset, args.world_size)
    print(f"GPT {args.preset!r}: {counts.total:,} parameters, FSDP2 over {args.world_size} gloo ranks, AdamW")
    print(f"{'bytes':<12}{'estimate':>12}" + "".join(f"{f'rank {r}':>12}" for r in range(len(held)))
          + f"{'all ranks':>12}{'exact sum':>12}")
    for role, per_param in (("parameters", 4), ("gradients", 4), ("optimizer", 8)):
        values = [h[role] for h in held]
        print(f"{role:<12}{getattr(estimate, role):>12,.0f}" + "".join(f"{v:>12,}" for v in values)
              + f"{sum(values):>12,}{per_param * counts.total:>12,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
