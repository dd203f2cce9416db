"""The helpers notebooks 04 and 10 call around their training loops: the GPT's configuration, the batches that
depend on the step only, sharded checkpoints, the memory probe, the crash demo, throughput and MFU, per-rank
profiles and all-reduce counts, and the settings checks. Each runs in this process (a gloo group of one rank
where a process group is needed), in seconds."""

from __future__ import annotations

import gc
import json
import os
import re
import types

import numpy as np
import pytest
import torch
import torch.distributed as dist

from helpers import profiling, throughput
from helpers.data.text_corpus import global_batch
from helpers.integrations import fsdp
from helpers.models.gpt import GPT, GPTConfig, gpt_config, init_weights, validation_loss

SMALL = GPTConfig(hidden_size=16, layers=2, n_heads=2, context=8)
CFG = {"batch_size": 4, "context": SMALL.context, "seed": 3, "eval_batches": 2}


@pytest.fixture
def group():
    """A gloo process group of one rank, in this process."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _fsdp_model():
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = GPT(SMALL)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    model.to_empty(device="cpu")
    init_weights(model, 0)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(model, optimizer, tokens, step):
    batch = global_batch(tokens, step, CFG)
    loss = torch.nn.functional.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    return loss


def _tokens():
    return np.random.default_rng(0).integers(0, 256, 4096).astype(np.uint8)


# --- the model and the batches ------------------------------------------------------------------------------

def test_gpt_config_takes_the_gallery_names_and_refuses_bad_sizes():
    assert gpt_config("tiny", hidden_size=64, layers=3) == GPTConfig(hidden_size=64, layers=3, n_heads=4,
                                                                     context=64)
    assert gpt_config("10M", layers=None).layers == 6   # None keeps the preset's
    with pytest.raises(ValueError, match="preset='100M' is not one of 'tiny', '10M'"):
        gpt_config("100M")
    with pytest.raises(ValueError, match=r"layers=2.0: use a whole number of 1 or more, or None for the 't"):
        gpt_config("tiny", layers=2.0)
    with pytest.raises(ValueError, match="hidden_size=0"):
        gpt_config("tiny", hidden_size=0)
    with pytest.raises(ValueError, match="hidden_size=130 must be a multiple of n_heads=4"):
        gpt_config("tiny", hidden_size=130)
    with pytest.raises(TypeError, match="d_model"):
        gpt_config("tiny", d_model=64)


def test_a_global_batch_depends_on_the_seed_and_the_step_only():
    tokens = _tokens()
    batch = global_batch(tokens, 5, CFG)
    assert batch.shape == (4, SMALL.context + 1) and batch.dtype == torch.int64
    assert torch.equal(batch, global_batch(tokens, 5, CFG))                    # drawn again: the same
    assert not torch.equal(batch, global_batch(tokens, 6, CFG))                # another step: another batch
    assert not torch.equal(batch, global_batch(tokens, 5, dict(CFG, seed=4)))  # another seed too
    window = batch[0].numpy().astype(np.uint8)
    assert any((tokens[i:i + 9] == window).all() for i in range(len(tokens) - 8))


# --- sharded checkpoints ----------------------------------------------------------------------------------

def test_a_sharded_checkpoint_resumes_the_model_the_optimizer_and_the_loop(group, tmp_path):
    tokens = _tokens()
    model, optimizer = _fsdp_model()
    checkpoints = fsdp.ShardedCheckpoints(tmp_path, keep=2)
    assert checkpoints.latest is None and checkpoints.resume(model, optimizer) is None
    history = []
    for step in (1, 2, 3):
        history.append(_step(model, optimizer, tokens, step).item())
        checkpoints.save(step, model, optimizer, history=history)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000002", "step_000003"]   # the newest two
    (tmp_path / "step_000009.tmp").mkdir()   # a crash mid-write: never taken for a checkpoint
    (tmp_path / "step_000009.tmp" / ".metadata").write_text("")
    assert checkpoints.latest.name == "step_000003"
    expected = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    after = _step(model, optimizer, tokens, 4).item()

    fresh, fresh_optimizer = _fsdp_model()
    state = checkpoints.resume(fresh, fresh_optimizer)
    assert state["step"] == 3 and state["history"] == history
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(tensor.full_tensor(), expected[name]), name
    assert _step(fresh, fresh_optimizer, tokens, 4).item() == after   # the AdamW moments came back too

    unrestored, unrestored_optimizer = _fsdp_model()   # the check can fail: a model that was not resumed
    assert _step(unrestored, unrestored_optimizer, tokens, 4).item() != after


def test_validation_loss_is_the_mean_over_fixed_windows(group):
    model, _ = _fsdp_model()
    tokens = _tokens()
    loss = validation_loss(model, tokens, CFG, "cpu")
    with torch.no_grad():
        batches = [global_batch(tokens, -1 - i, CFG) for i in range(CFG["eval_batches"])]
        losses = [torch.nn.functional.cross_entropy(model(b[:, :-1]).flatten(0, 1), b[:, 1:].flatten())
                  for b in batches]
        by_hand = np.mean([loss.item() for loss in losses])
    assert loss == pytest.approx(by_hand, rel=1e-6)
    assert model.training   # left in training mode
    assert validation_loss(model, tokens, dict(CFG, seed=9), "cpu") != pytest.approx(by_hand, rel=1e-6)


# --- what a rank holds ------------------------------------------------------------------------------------

def test_held_bytes_counts_each_role_once_and_sees_a_copy_kept_on_the_side(group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from helpers.memory_plan import count_parameters, model_state_bytes

    torch.manual_seed(0)
    model = DDP(GPT(SMALL))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step(model, optimizer, _tokens(), 1)
    gc.collect()   # earlier tests' garbage: tensors the walk would still find
    held = fsdp.held_bytes(model, optimizer, "cpu")
    counts = count_parameters(SMALL)
    table = fsdp.sharding_table(counts, 1, {"DDP": held, "FSDP": held})
    assert fsdp.plan_gap(table) == 0.0   # each role exactly the plan: 4 bytes a parameter, gradient, momentum
    assert table.loc["model state", "DDP planned"] == model_state_bytes(counts, "ddp", 1, "sgd").total / 2**20
    spare = [p.grad.clone() for p in model.parameters()]   # gradients kept twice: the probe must show it
    gc.collect()
    again = fsdp.held_bytes(model, optimizer, "cpu")
    assert again["other"] - held["other"] >= 4 * counts.total and again["gradients"] == held["gradients"]
    del spare
    wrong_world = fsdp.sharding_table(counts, 2, {"DDP": held, "FSDP": held})   # a plan for 2 ranks
    assert fsdp.plan_gap(wrong_world) > 0.01


# --- the crash demo and the settings ------------------------------------------------------------------------

def test_the_crash_happens_once_on_the_last_rank_at_its_step(group, monkeypatch, capsys):
    exits = []
    monkeypatch.setattr(fsdp.os, "_exit", exits.append)
    monkeypatch.setattr(fsdp.time, "sleep", lambda s: None)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    fsdp.crash_once(None, 5)
    fsdp.crash_once(6, 5)
    assert exits == []
    fsdp.crash_once(5, 5)
    assert exits == [1] and "rank 0: simulated crash at step 5" in capsys.readouterr().out
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")   # the restarted group runs through
    fsdp.crash_once(5, 5)
    assert exits == [1]


def test_the_checkpoint_settings_are_refused_with_the_fix():
    fsdp.check_checkpoints(25, 35, 150, None)
    fsdp.check_checkpoints(25, None, 150, None)
    with pytest.raises(ValueError, match="before the first checkpoint"):
        fsdp.check_checkpoints(25, 5, 150, None)
    with pytest.raises(ValueError, match="lies beyond max_steps=12"):
        fsdp.check_checkpoints(4, 20, 150, 12)
    with pytest.raises(ValueError, match=r"must lie in 2..steps \(30\)"):
        fsdp.check_checkpoints(10, 35, 30, None)
    with pytest.raises(ValueError, match="checkpoint_every=0"):
        fsdp.check_checkpoints(0, None, 30, None)
    with pytest.raises(ValueError, match="cpu_offload=True keeps a GPU's shards"):
        fsdp.check_checkpoints(25, 35, 150, None, cpu_offload=True, device="cpu")
    fsdp.check_checkpoints(25, 35, 150, None, cpu_offload=True, device="cuda")


def test_the_elastic_settings_split_the_batch_everywhere():
    plan = types.SimpleNamespace(processes=2, device="cpu")
    assert fsdp.check_elastic([1, 4], plan, batch_size=16, micro_batches=4, steps=24) == (2, "cpu")
    assert fsdp.check_elastic([1], types.SimpleNamespace(processes=1, device="cpu"), batch_size=16,
                              micro_batches=4, steps=2) == (2, "cpu")   # the elastic run: 2 ranks at least
    cases = [(dict(micro_batches=3), "micro_batches=3 does not divide"),
             (dict(resume_world_sizes="[1, 4]"), "use -y 'resume_world_sizes: [1, 4]'"),
             (dict(resume_world_sizes=[1, 3]),
              "does not split over the 3 ranks of the resume on 3: use a multiple of 24"),
             (dict(resume_world_sizes=[]), "give a list of world sizes"),
             (dict(steps=1), "at least 2 steps"),
             (dict(micro_batches=0), "micro_batches=0")]
    for change, message in cases:
        args = dict(resume_world_sizes=[1, 4], batch_size=16, micro_batches=4, steps=24) | change
        with pytest.raises(ValueError, match=re.escape(message)):
            fsdp.check_elastic(args.pop("resume_world_sizes"), plan, **args)


# --- throughput --------------------------------------------------------------------------------------------

def test_the_timer_leaves_out_the_warm_up_steps(monkeypatch):
    clock = iter([0.0, 5.0, 5.0, 10.0, 10.0, 10.5, 10.5, 11.0, 11.0, 11.5])
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
    timer = throughput.StepTimer()
    for _ in range(5):
        timer.start()
        timer.stop()
    assert timer.seconds == [5.0, 5.0, 0.5, 0.5, 0.5]
    assert timer.steady(2) == [0.5, 0.5, 0.5]
    assert timer.tokens_per_s(100, warmup=2) == pytest.approx(200.0)
    assert timer.tokens_per_s(100, warmup=0) == pytest.approx(500 / 11.5)   # warm-up counted: far slower
    with pytest.raises(RuntimeError):
        throughput.StepTimer().stop()


def test_flops_per_token_and_mfu():
    config = gpt_config("tiny")
    # 2 blocks of 12 d^2 matmul weights, the head d x 256; attention 12 x layers x context x d
    expected = 6 * (2 * 12 * 128 ** 2 + 128 * 256) + 12 * 2 * 64 * 128
    assert throughput.flops_per_token(128, 2, 64, 256) == expected
    ranks = [{"tokens_per_s": 1000.0, "device_name": "cpu", "precision": "fp32", "peak_flops": p}
             for p in (1e9, 3e9)]
    measured = throughput.model_flops_utilisation(config, ranks)
    assert measured.peak_per_rank == 2e9 and "measured fp32 matmul on cpu" in measured.peak_source
    assert measured.mfu == pytest.approx(expected * 1000 / (2 * 2e9))
    gpu = [dict(r, device_name="NVIDIA H200", precision="bf16") for r in ranks]
    datasheet = throughput.model_flops_utilisation(config, gpu)
    assert datasheet.peak_per_rank == 989e12 and "datasheet" in datasheet.peak_source
    assert "MFU" in datasheet.summary(2, "bf16", 812.0) and "812 MiB" in datasheet.summary(2, "bf16", 812.0)
    assert throughput.datasheet_flops("NVIDIA H200", "fp32") is None   # fp32 has no tensor-core figure here


def test_the_matmul_peak_and_the_device_on_a_cpu():
    peak = throughput.device_peak("cpu")
    assert peak["device_name"] == "cpu" and 1e6 < peak["peak_flops"] < 1e14
    assert throughput.matmul_peak_flops("cpu", size=64, repeats=3) > 0


def test_the_compile_cache_state():
    assert throughput.cache_state({"hit": 3, "miss": 0}) == "warm"
    assert throughput.cache_state({"hit": 0, "miss": 3}) == "cold"
    assert throughput.cache_state({"hit": 1, "miss": 2}) == "partly warm"
    assert throughput.cache_state({"hit": 0, "miss": 0}) == "off"
    assert set(throughput.inductor_cache_counts()) == {"hit", "miss"}


# --- profiles and all-reduce counts ----------------------------------------------------------------------

def test_time_by_phase_adds_up_a_trace(tmp_path):
    events = [{"ph": "X", "name": "forward", "dur": 2000}, {"ph": "X", "name": "forward", "dur": 1000},
              {"ph": "X", "name": "data", "dur": 500}, {"ph": "X", "name": "gloo:all_reduce", "dur": 4000},
              {"ph": "X", "name": "ncclDevKernel_AllReduce", "cat": "kernel", "dur": 9000},   # GPU side
              {"ph": "i", "name": "backward", "dur": 7000}]                                   # an instant
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    assert profiling.time_by_phase(trace) == {"data": 0.5, "forward": 3.0, "backward": 0.0, "optimizer": 0.0,
                                              "communication": 4.0}
    table = profiling.phases_by_rank([trace, trace])
    assert list(table.index) == ["rank 0", "rank 1"] and table.loc["rank 1", "forward"] == 3.0


def test_allreduces_are_counted_per_step_and_no_sync_skips_them(group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(GPT(SMALL))
    counter = profiling.AllreduceCounter(model)
    tokens = _tokens()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    _step(model, optimizer, tokens, 1)
    counter.end_step()
    with model.no_sync():
        _step(model, optimizer, tokens, 2)
    counter.end_step()
    _step(model, optimizer, tokens, 3)
    counter.end_step()
    calls = [s["calls"] for s in counter.steps]
    assert calls[0] >= 1 and calls[1] == 0 and calls[2] >= 1
    assert counter.last_step()["allreduced_mb_per_step"] > 0
    fsdp_model, _ = _fsdp_model()
    assert profiling.AllreduceCounter(fsdp_model).last_step() == {"allreduces_per_step": 0,
                                                                   "allreduced_mb_per_step": 0.0}


def test_a_rank_profile_is_written_where_asked(group, tmp_path):
    quiet = profiling.RankProfiler(None, 1, "cpu")
    with quiet:
        with quiet.label("data"):
            pass
        quiet.step()
    assert quiet.trace is None
    profiler = profiling.RankProfiler(str(tmp_path), 1, "cpu")
    with profiler:
        for _ in range(3):   # one skipped, one of warm-up, one recorded
            with profiler.label("forward"):
                torch.ones(8) @ torch.ones(8)
            profiler.step()
    assert profiler.trace == str(tmp_path / "rank0.json")
    assert profiling.time_by_phase(profiler.trace)["forward"] > 0


def test_the_profiling_settings_and_the_run_folder(tmp_path, monkeypatch):
    profiling.check_profiling(4, 40, "cuda")
    profiling.check_profiling(1, 0.5, "cuda")
    for steps, straggler, message in [(0, 40, "profile_steps=0"), (4, -5, "straggler_ms=-5"),
                                      (4, True, "straggler_ms=True")]:
        with pytest.raises(ValueError, match=message):
            profiling.check_profiling(steps, straggler, "cuda")
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    profiling.check_profiling(4, 40, "cpu")
    assert os.environ["KINETO_LOG_LEVEL"] == "6"
    (tmp_path / "out" / "traces").mkdir(parents=True)
    (tmp_path / "out" / "traces" / "old.json").write_text("{}")
    folder = profiling.run_folder(str(tmp_path / "out"), "10_x", fresh=("traces", "checkpoint"))
    assert folder == tmp_path / "out" and not list((folder / "traces").iterdir())
    assert (folder / "checkpoint").is_dir()
    monkeypatch.setenv("GALLERY_RUN_DIR", str(tmp_path / "run"))
    assert profiling.run_folder(None, "10_x") == tmp_path / "run" / "10_x"
    from helpers.paths import ROOT

    assert profiling.shown(ROOT / "data" / "cache" / "x") == "data/cache/x"
    assert profiling.shown(tmp_path) == str(tmp_path)
