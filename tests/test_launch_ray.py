"""The cluster path of the launcher: `@distributed(..., cluster=...)` runs the function as Ray Train workers.

Ray is slow to start (seconds for `ray.init`, tens of seconds for a worker group on 2 cores), so each test
does as much as it can per launch: three Ray launches in all, about two minutes on 2 cores.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil
import pytest

from helpers import LaunchError, distributed, progress_bar, worker_context
from tests.support import LIVE_CLUSTERS

pytestmark = pytest.mark.timeout(600)


def _cluster_processes() -> set[int]:
    """The processes of this test process's two-node clusters (tests/conftest.py) and their descendants."""
    pids = set()
    for cluster in LIVE_CLUSTERS:
        for node in cluster.list_all_nodes():
            for infos in node.all_processes.values():
                for info in infos:
                    with contextlib.suppress(psutil.Error):
                        started = psutil.Process(info.process.pid)
                        pids |= {started.pid} | {p.pid for p in started.children(recursive=True)}
    return pids


def _ray_children() -> list[str]:
    """Command lines of this process's descendants that belong to Ray (raylet, GCS, workers), except those
    of a two-node cluster another test of this process started."""
    names = []
    theirs = _cluster_processes()
    for child in psutil.Process().children(recursive=True):
        if child.pid in theirs:
            continue
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "ray" in cmd and child.status() != psutil.STATUS_ZOMBIE:
            names.append(cmd[:120])
    return names


def _ray_initialized() -> bool:
    import ray

    return ray.is_initialized()


def test_bad_arguments_fail_before_ray_starts():
    import threading

    lock = threading.Lock()

    @distributed(processes=2, cluster="ray")
    def fn(x):
        return x

    with pytest.raises(LaunchError, match="cannot be sent to the worker processes"):
        fn.distributed(lock)
    with pytest.raises(LaunchError, match="at least 1"):
        fn.options(processes=0).distributed(1)
    with pytest.raises(LaunchError, match="cluster=''"):
        fn.options(cluster="").distributed(1)
    with pytest.raises(LaunchError, match="max_restarts"):
        fn.options(max_restarts=-1).distributed(1)
    assert not _ray_initialized() and not _ray_children()


def test_private_instance_runs_ranks_and_leaves_nothing(capfd):
    """No cluster running: a local Ray instance is started, used, and shut down with every process."""
    home_token = Path.home() / ".ray" / "auth_token"
    had_token = home_token.exists()

    @distributed(processes=2, cluster="ray")
    def train(scale):
        import torch
        import torch.distributed as dist

        ctx = worker_context()
        dist.init_process_group(ctx.backend)   # as under torchrun: the function creates its group
        total = torch.tensor([float(ctx.rank + 1)])
        dist.all_reduce(total)
        print(f"rank {ctx.rank} of {ctx.world_size}: sum {total.item()}")
        dist.destroy_process_group()
        return {"rank": ctx.rank, "world": ctx.world_size, "local_world": ctx.local_world_size,
                "backend": ctx.backend, "sum": total.item() * scale,
                "attempt": os.environ["TORCHELASTIC_RESTART_COUNT"], "master": os.environ["MASTER_PORT"]}

    results = train.distributed(10)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 and r["local_world"] == 2 and r["backend"] == "gloo" for r in results)
    assert [r["sum"] for r in results] == [30.0, 30.0]
    assert [r["attempt"] for r in results] == ["0", "0"]
    out = capfd.readouterr().out
    assert "[rank0] rank 0 of 2: sum 3.0" in out and "[rank1] rank 1 of 2: sum 3.0" in out
    assert not _ray_initialized(), "the private instance must be shut down"
    assert not _ray_children(), f"Ray processes left behind: {_ray_children()}"
    assert had_token or not home_token.exists(), "the token must stay in memory, not in ~/.ray"


@pytest.fixture(scope="module")
def two_nodes(two_node_cluster):
    """The simulated two-node cluster of tests/conftest.py, shared by the last tests here."""
    return two_node_cluster


@pytest.fixture
def attached_ray(two_nodes):
    """A connection the test made itself (`ray.init`): the launcher must use it and leave it open."""
    import ray

    ray.init(address=two_nodes.address, log_to_driver=False, logging_level="ERROR")
    try:
        yield ray
    finally:
        ray.shutdown()


def test_errors_and_restarts_on_an_existing_instance(attached_ray, capfd, tmp_path):
    """On a `ray.init()` the test made: a Ray Dataset argument reaches each rank as its shard,
    max_restarts=1 restarts the group once, and the rank's exception comes back as its own type.

    A failing rank tears its group down, so rank 1 waits for rank 0's line of the same attempt to
    be printed (a marker file) before it raises; without that, rank 0's line is a race (CI lost it once).
    """
    import ray.data

    class BadBatch(ValueError):
        pass

    markers = str(tmp_path)

    @distributed(processes=2, cluster="ray", max_restarts=1)
    def flaky(data):
        ctx = worker_context()
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        rows = [int(x) for batch in data.iter_batches(batch_size=4) for x in batch["x"]]
        print(f"attempt {attempt}: {len(rows)} rows")
        marker = os.path.join(markers, f"rank0-printed-{attempt}")
        if ctx.rank == 0:
            open(marker, "w").close()
        if ctx.rank == 1:
            deadline = time.monotonic() + 60
            while not os.path.exists(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # rank 0's line is sent to the collector asynchronously
            raise BadBatch(f"rank {ctx.rank} got a bad batch")

    with pytest.raises(BadBatch, match="rank 1 of 2 raised BadBatch") as info:
        flaky.distributed(ray.data.from_items([{"x": i} for i in range(20)]))
    assert info.value.rank == 1 and "in flaky" in info.value.remote_traceback
    out = capfd.readouterr().out
    assert "[rank0] attempt 0: 10 rows" in out and "[rank1] attempt 1: 10 rows" in out, out
    assert attached_ray.is_initialized(), "a connection the user made stays open"


def test_two_node_cluster_trains_together(two_nodes, monkeypatch):
    """Two nodes of one CPU each: the ranks land on different nodes and train one model together.

    The address is given to the launcher, which connects for the call and disconnects afterwards.
    Rank 0's progress bar travels through the relay actor and is drawn by the driver.
    """
    import helpers.progress
    from tests.support import RecordingView

    view = RecordingView()
    monkeypatch.setattr(helpers.progress.view, "progress_view", lambda enabled=None: view)

    @distributed(processes=2, cluster=two_nodes.address)
    def train(steps):
        import ray
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        ctx = worker_context()
        dist.init_process_group(ctx.backend)
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(ctx.rank)   # each rank its own data
        x = torch.randn(64, 4, generator=generator)
        y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1
        losses = []
        for _ in progress_bar(range(steps), desc=f"rank {ctx.rank}", unit="step"):
            time.sleep(0.03)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        dist.destroy_process_group()
        assert ctx.node == ray.get_runtime_context().get_node_id(), "worker_context() names the Ray node"
        return {"node": ctx.node, "rank": ctx.rank,
                "local_rank": ctx.local_rank, "weights": weights, "losses": losses}

    results = train.distributed(30)
    assert results[0]["node"] != results[1]["node"], "both ranks ran on the same node"
    # (LOCAL_RANK stays 0 and 1: Ray counts local ranks per IP address, and both nodes share this machine's.)
    assert (results[0]["weights"] == results[1]["weights"]).all(), "DDP kept the replicas identical"
    assert all(r["losses"][-1] < 0.1 * r["losses"][0] for r in results), "the model did not train"
    assert not _ray_initialized()
    states = [s for _, s in view.drawn]
    assert states, "no bar state reached the driver"
    assert {s["desc"] for s in states} == {"rank 0"}, "rank 0's bar, and only it, reaches the driver"
    assert states[-1]["n"] == states[-1]["total"] == 30 and states[-1]["closed"], states[-1]
    assert any(0 < s["n"] < 30 for s in states), "the bar did not move while the ranks trained"


def test_a_folder_a_worker_cannot_see_fails_before_training(two_nodes, tmp_path):
    """What a rank on another machine meets when output_dir is local to the notebook's: the marker the
    notebook's process wrote is not there. Simulated by removing it (both nodes share this disk)."""
    from helpers.shared_storage import SharedStorageError, shared_paths

    @distributed(processes=2, cluster=two_nodes.address)
    def train(shared):
        shared.check()
        return "trained"

    with shared_paths(output_dir=tmp_path / "out") as shared:
        assert train.distributed(shared) == ["trained", "trained"]
        os.remove(shared.paths[0].marker)
        with pytest.raises(SharedStorageError, match=r"rank \d on node [0-9a-f]{16,} cannot see the folder "
                           r"output_dir=.*/out .*storage every node reaches"):
            train.distributed(shared)
