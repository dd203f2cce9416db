"""What a rank needs to know about itself, read from the standard torch elastic environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

from helpers.env import project_env, project_env_name

# Set by the launchers in every rank (and for an in-process call): the torch backend the launch chose.
BACKEND_ENV = project_env_name("DIST_BACKEND")
# Set by the Ray launcher in every worker: the Ray node id of the machine the rank runs on.
NODE_ENV = project_env_name("NODE_ID")


@dataclass(frozen=True)
class WorkerContext:
    """A rank's place in the job (see `worker_context`): pass `backend` and `device` to the torch calls."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    backend: str
    device: str  # "cuda:<local_rank>" or "cpu"
    attempt: int = 0  # 0, then 1, 2... when max_restarts restarted the group (TORCHELASTIC_RESTART_COUNT)
    node: str = ""    # the machine the rank runs on: its Ray node id on a cluster, else the host name

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def worker_context() -> WorkerContext:
    """This rank's place in the job: works under our launcher, torchrun, or in-process (rank 0 of 1).

    The backend is the launcher's choice (nccl with one GPU per rank, gloo on CPU) unless overridden,
    so a notebook can pass `ctx.backend` and `ctx.device` to the real torch calls it makes. `attempt`
    says which run of the group this is after `max_restarts` restarted it (both launchers set torch
    elastic's `TORCHELASTIC_RESTART_COUNT`), so a rank can resume instead of starting over. `node` names
    the machine: on a Ray cluster its node id (several nodes may share a host, as in the tests' simulated
    cluster), else the host name; a notebook returns it so that the reader sees where the ranks ran.
    """
    import socket

    import torch

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = project_env("DIST_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
    return WorkerContext(
        rank=int(os.environ.get("RANK", "0")),
        local_rank=local_rank,
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        backend=backend,
        device=device,
        attempt=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        node=project_env("NODE_ID") or socket.gethostname(),
    )
