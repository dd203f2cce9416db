"""helpers.integrations.deepspeed: notebook 05's ZeRO settings check, what a rank holds (loaded and after
training) and the memory plan it is held to, DeepSpeed made CPU-ready. Each measure is shown counting what it
exists for, and failing where the thing it proves is missing."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from helpers.integrations import deepspeed as zero
from helpers.memory_plan import count_parameters


def _tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)


def test_a_stage_deepspeed_has_and_offload_only_with_zero():
    for stage in zero.STAGES:
        zero.check_zero(stage, False)
    zero.check_zero(3, True)
    for bad in (4, -1, "3", True, 3.0 + 0.5):
        with pytest.raises(ValueError, match=r"is not a DeepSpeed ZeRO stage: use 0 \(plain data parallel\)"):
            zero.check_zero(bad, False)
    with pytest.raises(ValueError, match="offload_optimizer=True needs ZeRO: set zero_stage to 1, 2 or 3"):
        zero.check_zero(0, True)
    with pytest.raises(ValueError, match="offload_optimizer='yes': use True or False"):
        zero.check_zero(2, "yes")


def test_loaded_share_counts_the_zero3_partition_not_the_whole_parameter():
    whole = torch.nn.Linear(4, 4)                       # 20 elements, held whole
    assert zero.loaded_share(whole) == {"local": 20, "total": 20}
    sharded = torch.nn.Linear(4, 4)
    for p in sharded.parameters():   # what zero.Init leaves: an empty tensor, this rank's half, the count
        p.ds_tensor, p.ds_numel = torch.empty(p.numel() // 2), p.numel()
        p.data = torch.empty(0)
    assert zero.loaded_share(sharded) == {"local": 10, "total": 20}


def _engine(model, optimizer):
    """A DeepSpeed engine as model_state_bytes sees one: the module, and the optimizer behind wrappers."""
    wrapped = SimpleNamespace(optimizer=SimpleNamespace(optimizer=optimizer))   # accelerate's, then ZeRO's
    return SimpleNamespace(module=model, optimizer=wrapped)


def test_model_state_bytes_counts_parameters_master_copy_and_optimizer_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)                      # 72 fp32 elements: 288 bytes
    adam = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    adam.step()
    held = zero.model_state_bytes(_engine(model, adam))
    # the optimizer steps the parameters themselves (no master copy of its own); Adam's two moments, 0-d steps
    # aside
    assert held == {"parameters": 288, "fp32 master": 0, "optimizer state": 2 * 288}
    # a master copy of its own (ZeRO 1-2 in mixed precision: the optimizer steps fp32 copies of the partition)
    master = [torch.zeros(36)]
    sgd = torch.optim.SGD(master, lr=0.1, momentum=0.9)
    master[0].grad = torch.ones(36)
    sgd.step()
    assert zero.model_state_bytes(_engine(model, sgd)) == {
        "parameters": 288, "fp32 master": 144, "optimizer state": 144}


def test_model_state_bytes_counts_a_gathered_zero3_parameter_on_top_of_its_shard():
    model = torch.nn.Linear(4, 4, bias=False)         # 16 elements
    p = next(model.parameters())
    p.ds_tensor = torch.zeros(8)                       # this rank's half: 32 bytes
    sgd = torch.optim.SGD([p.ds_tensor], lr=0.1)
    gathered = zero.model_state_bytes(_engine(model, sgd))
    p.data = torch.empty(0)
    assert gathered["parameters"] == 32 + 64                                        # gathered: whole as well
    assert zero.model_state_bytes(_engine(model, sgd))["parameters"] == 32         # released: the shard only


def test_the_plan_per_stage_and_for_the_fp32_sgd_runs():
    counts = count_parameters(_tiny_llama_config())
    table = zero.zero_memory_plan({"tiny": counts}, 2)
    gpu = table[("tiny, GB", "GPU per rank")]
    assert list(table.index) == list(zero.ZERO_TECHNIQUES.values())
    assert gpu["ZeRO-0 (data parallel)"] == pytest.approx(16 * counts.total / 1e9)   # 16 bytes a parameter
    assert gpu["ZeRO-0 (data parallel)"] > gpu["ZeRO-1"] > gpu["ZeRO-2"]
    assert gpu["ZeRO-3"] < gpu["ZeRO-0 (data parallel)"]   # (2 layers: the gathered one outweighs stage 2's)
    assert table[("tiny, GB", "CPU per rank")]["ZeRO-0 (data parallel)"] == 0
    # the fp32 SGD runs: fp32 parameters and one momentum buffer, 8 bytes a parameter, all on every rank
    assert zero.parity_run_plan(counts, 0, 2) == 8 * counts.total
    # stage 1 keeps the fp32 parameters whole beside the master copy of its partition: less from 3 ranks on
    assert zero.parity_run_plan(counts, 1, 2) == zero.parity_run_plan(counts, 0, 2)
    assert zero.parity_run_plan(counts, 1, 4) < zero.parity_run_plan(counts, 0, 4)
    assert zero.parity_run_plan(counts, 3, 2) < zero.parity_run_plan(counts, 2, 2)
    held = {s: {"parameters": zero.parity_run_plan(counts, s, 2), "fp32 master": 0, "optimizer state": 0}
            for s in zero.STAGES}
    table = zero.memory_against_plan(held, counts, 2)
    assert list(table["measured / plan"]) == pytest.approx([1, 1, 1, 1])
    assert table["vs ZeRO-0"].iloc[0] == 1 and table["vs ZeRO-0"].iloc[3] < 1
    held[3] = dict(held[0])   # a stage 3 that sharded nothing is far from its plan
    assert zero.memory_against_plan(held, counts, 2)["measured / plan"].iloc[3] > 1.3


def test_prepare_names_the_cpu_accelerator_only_without_a_gpu(monkeypatch):
    import helpers.launch.options as options

    for name in ("DS_ACCELERATOR", "TOKENIZERS_PARALLELISM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(options, "gpu_count", lambda: 1)
    zero.prepare_deepspeed()
    assert "DS_ACCELERATOR" not in os.environ and os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setattr(options, "gpu_count", lambda: 0)
    zero.prepare_deepspeed()
    assert os.environ["DS_ACCELERATOR"] == "cpu"


def test_ranks_join_deepspeed_s_group_without_building_the_shared_memory_kernel():
    from helpers import distributed

    @distributed(processes=2, device="cpu")
    def joined():   # (imports here: cloudpickle would send torch.ops with a global torch and an `.ops`)
        import deepspeed.comm
        import torch
        from deepspeed.ops import __compatible_ops__ as compatible

        from helpers import worker_context

        zero.join_group(worker_context().backend)
        return (deepspeed.comm.get_world_size(), compatible["deepspeed_shm_comm"],
                torch.get_float32_matmul_precision())

    assert joined.distributed() == [(2, False, "highest")] * 2
