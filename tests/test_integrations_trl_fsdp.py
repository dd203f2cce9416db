"""helpers.integrations.trl_fsdp: what notebook 07 calls around TRL, each piece made to fail once, through
`trl_fsdp` as the notebook calls it (the pieces live in accelerate_fsdp, fsdp_tensors, trainer_memory,
router_load and fsdp_evaluation; trl_fsdp re-exports them, and tests/test_reexports.py holds it to that).

The accelerate settings, the CPU FSDP trainer and the callbacks run here in one process, on a tiny
GPT-OSS folder, for a few SFTTrainer steps. What needs several ranks (rank 0's broadcast loading, the sharded
model) runs in notebook 07 itself, at its defaults, where the checks assert that the parameters are sharded
DTensors and that DDP and FSDP take the same steps.
"""

from __future__ import annotations

import os

import pytest
import torch

from helpers.integrations import trl_fsdp

FSDP2 = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
         "fsdp_transformer_layer_cls_to_wrap": "GptOssDecoderLayer", "fsdp_reshard_after_forward": True,
         "fsdp_cpu_ram_efficient_loading": False}


@pytest.fixture
def clean_environment(monkeypatch):
    """The FSDP settings a test sets are gone afterwards (monkeypatch restores the environment)."""
    for key in [k for k in os.environ if k.startswith("FSDP_") or k == "ACCELERATE_USE_FSDP"]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()


def test_the_environment_is_what_accelerate_launch_writes():
    assert trl_fsdp.accelerate_environment(None) == {}
    env = trl_fsdp.accelerate_environment(dict(FSDP2, fsdp_transformer_layer_cls_to_wrap=["A", "B"]))
    assert env == {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2",
                   "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_TRANSFORMER_CLS_TO_WRAP": "A,B",
                   "FSDP_RESHARD_AFTER_FORWARD": "true",
                   "FSDP_CPU_RAM_EFFICIENT_LOADING": "false"}
    with pytest.raises(ValueError, match="'version': an accelerate fsdp_config key starts with 'fsdp_'"):
        trl_fsdp.accelerate_environment({"version": 2})


def test_each_trainer_gets_its_own_settings(clean_environment):
    from accelerate.utils import FullyShardedDataParallelPlugin

    os.environ["FSDP_OFFLOAD_PARAMS"] = "true"   # an earlier run's setting
    trl_fsdp.set_accelerate_config(FSDP2)
    assert "FSDP_OFFLOAD_PARAMS" not in os.environ and os.environ["ACCELERATE_USE_FSDP"] == "true"
    plugin = FullyShardedDataParallelPlugin()   # what accelerate builds from the environment
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.transformer_cls_names_to_wrap == ["GptOssDecoderLayer"]
    trl_fsdp.set_accelerate_config(None)
    assert not [k for k in os.environ if k.startswith("FSDP_") or k == "ACCELERATE_USE_FSDP"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from helpers.models.gpt_oss import build_gpt_oss_checkpoint

    return str(build_gpt_oss_checkpoint(tmp_path_factory.mktemp("gpt-oss") / "bf16", mxfp4=False))


@pytest.fixture(scope="module")
def rows():
    from helpers.data.sft_tasks import build_sft_tasks, validate_sft_jsonl

    paths = build_sft_tasks("reverse", n_train=48, n_test=6, seed=0, min_len=3, max_len=4)
    train = [{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]}
             for r in validate_sft_jsonl(paths["train"])]
    return train, validate_sft_jsonl(paths["test"])


def _trainer(trainer_class, folder, rows, tmp_path, callbacks=(), lora=True):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import SFTConfig

    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=3, learning_rate=1e-2,
                     use_cpu=True, completion_only_loss=True, max_length=64, logging_steps=1,
                     save_strategy="no", report_to="none", disable_tqdm=True)
    loading = trl_fsdp.ShardsFromRank0(fsdp=True)   # one process: nothing to receive, rank 0 loads
    model = loading.from_pretrained(folder)
    model.config.update({"output_router_logits": True, "use_cache": False})
    tokenizer = AutoTokenizer.from_pretrained(folder)
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM",
                             target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])
    return model, tokenizer, trainer_class(
        model=model, args=args, processing_class=tokenizer, train_dataset=Dataset.from_list(rows[0]),
        peft_config=peft_config if lora else None, callbacks=[loading, *callbacks])


def test_fsdp_on_cpu_puts_back_the_plugin_accelerate_drops(clean_environment, folder, rows, tmp_path):
    from accelerate.utils import DistributedType
    from trl import SFTTrainer

    trl_fsdp.set_accelerate_config(FSDP2)
    plain = _trainer(SFTTrainer, folder, rows, tmp_path)[2]
    assert not plain.is_fsdp_enabled   # accelerate on CPU: FSDP silently dropped
    trl_fsdp.set_accelerate_config(FSDP2)
    trainer = _trainer(trl_fsdp.fsdp_on_cpu(SFTTrainer), folder, rows, tmp_path)[2]
    assert trainer.is_fsdp_enabled and trainer.accelerator.state.distributed_type == DistributedType.FSDP
    assert trainer.accelerator.state.fsdp_plugin.fsdp_version == 2
    trl_fsdp.set_accelerate_config(None)
    assert not _trainer(trl_fsdp.fsdp_on_cpu(SFTTrainer), folder, rows, tmp_path)[2].is_fsdp_enabled


def test_the_callbacks_record_a_lora_run(clean_environment, folder, rows, tmp_path):
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    from helpers.models.gpt_oss import load_options

    trl_fsdp.set_accelerate_config(None)
    memory, adapter = trl_fsdp.StepMemory(1), trl_fsdp.AdapterUpdates()
    model, tokenizer, trainer = _trainer(SFTTrainer, folder, rows, tmp_path, lora=True)
    router = trl_fsdp.RouterLoad(model, tokenizer.pad_token_id)
    evaluation = trl_fsdp.HeldOutEvaluation(tokenizer, rows[1])
    for callback in (trl_fsdp.NoBackwardPrefetch(), adapter, evaluation, router, memory):
        trainer.add_callback(callback)
    trainer.train()

    counts = router.counts()
    assert counts.shape == (3, 2, 4)   # steps, layers, experts
    assert (counts.sum(axis=2) % 2 == 0).all() and (counts.sum(axis=2) > 0).all()   # top-2 of every token
    assert set(memory.held) == {"parameters", "gradients", "optimizer state"} and memory.peak
    assert memory.held["gradients"] < memory.held["parameters"]   # LoRA: only the adapters have gradients
    lora = [n for n in adapter.grad_sums if "lora_" in n]
    assert lora and all(adapter.grad_sums[n] > 0 for n in lora)   # A too: B moved after the first step
    assert adapter.expert_change and min(adapter.expert_change.values()) > 0
    assert set(evaluation.results) == {"before", "after", "seconds"}
    assert evaluation.results["after"]["loss"] < evaluation.results["before"]["loss"]
    assert len(evaluation.results["after"]["answers"]) == len(rows[1])
    summary = trl_fsdp.sharding_summary(trainer.model_wrapped)
    assert summary["dtensor_params"] == 0 and summary["fsdp_modules"] == [] and summary["whole_params"]

    trl_fsdp.save_trained(trainer, str(tmp_path / "adapter"), tokenizer)
    saved = sorted(p.name for p in (tmp_path / "adapter").iterdir())
    assert "adapter_model.safetensors" in saved and "model.safetensors.index.json" not in saved
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(folder, **load_options(folder))
    reloaded = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
    name = next(n for n in adapter.expert_change)
    live = dict(trainer.model.named_parameters())[name]
    assert torch.equal(dict(reloaded.named_parameters())[name], live.detach())


def test_router_load_counts_training_forwards_only(folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    router = trl_fsdp.RouterLoad(model, pad_token_id=0)
    ids = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]])   # 2 padding tokens
    with torch.no_grad():
        model(input_ids=ids)
    assert router.current.sum() == 0   # evaluation: not counted
    model(input_ids=ids)
    assert router.current.sum(axis=1).tolist() == [8 * 2, 8 * 2]   # 8 tokens, top-2, in both layers
    router.on_step_end(None, None, None)
    assert router.counts().shape == (1, 2, 4) and router.current.sum() == 0
    with pytest.raises(ValueError, match="no GptOssTopKRouter"):
        trl_fsdp.RouterLoad(torch.nn.Linear(2, 2), 0)


def test_memory_table_and_plots():
    import matplotlib
    import numpy as np
    import pandas as pd

    matplotlib.use("Agg")
    run = {"held": {"parameters": 2**20, "gradients": 2**20, "optimizer state": 2**20},
           "memory": {"cpu": 5 * 2**20}, "cuda_peak_mb": None}
    table = trl_fsdp.memory_table({"ddp": [run, run], "fsdp": [run]}, {"ddp": 3 * 2**20, "fsdp": 2**20})
    assert list(table.index) == [("DDP", "rank 0"), ("DDP", "rank 1"), ("FSDP", "rank 0")]
    assert table.loc[("DDP", "rank 0"), "model state, measured, MiB"] == 3.0
    assert table.loc[("FSDP", "rank 0"), "model state, planned, MiB"] == 1.0
    counts = np.ones((12, 6, 4), dtype=int)
    assert len(trl_fsdp.plot_router_load(counts, ["sliding_attention", "full_attention"] * 3).axes) == 4
    logs = pd.DataFrame([{"step": 1, "loss": 2.0}, {"step": 1, "aux_loss": 2.1},
                         {"step": 2, "aux_loss": 2.0}])
    figure = trl_fsdp.plot_losses(pd.Series([3.0, 2.0, 1.0]), logs, 2, "title")
    assert len(figure.axes) == 2 and len(figure.axes[1].lines) == 2   # the aux loss, the even router's line


def test_a_ranks_shard_and_the_full_value_of_a_dtensor():
    """What the memory records and the adapter checks read from a sharded parameter: the rank's own shard
    (`local_shard`) and the whole tensor (`full_value`); a plain tensor is its own shard."""
    import torch.distributed as dist
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        whole = torch.arange(6.0).reshape(3, 2)
        sharded = distribute_tensor(whole, init_device_mesh("cpu", (1,)), [Shard(0)])
        assert type(trl_fsdp.local_shard(sharded)) is torch.Tensor
        assert torch.equal(trl_fsdp.local_shard(sharded), whole)
        assert torch.equal(trl_fsdp.full_value(sharded), whole)
        assert trl_fsdp.local_shard(whole) is whole
    finally:
        dist.destroy_process_group()
