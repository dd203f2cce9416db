"""Each notebook's checks can fail: inject the bug a check names, and the notebook must stop with that check.

A check that passes on a working run proves little until it has failed on a broken one. Here each bug is one
line changed in a copy of the notebook (summing gradients instead of averaging them, skipping the all-reduce,
forgetting `set_epoch`, a resume that restores nothing), run with papermill at a small size; the test expects
the notebook to fail with the message of the check that names that bug. Each reference file names one more:
a subtle regression (a learning rate 3x smaller) that the notebook's bars let through at its defaults and
its reference check must stop. The notebooks themselves are never changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import nbformat
import pytest

from helpers.gallery.execute import execute_notebook
from helpers.paths import NOTEBOOKS_DIR
from helpers.reference import REFERENCES_DIR

pytestmark = pytest.mark.notebook


@dataclass(frozen=True)
class Mutation:
    notebook: str
    why: str            # the bug, in words
    original: str       # a line (or lines) of the notebook's code, present exactly once
    mutated: str        # what the bug makes of it
    expected: str       # the check's message (a regular expression)
    parameters: dict[str, Any] = field(default_factory=dict)
    slow: bool = False  # in `make mutation` only: `make test`'s time budget keeps just the cheapest ones


# notebook 04 at a small size, no crash: the checks under test come after training
_NB04_SMALL = dict(steps=30, checkpoint_every=10, max_steps=2, fail_at_step=None, parity_steps=2,
                   eval_batches=1)
# notebook 03 at a small size: a few hundred users, four steps, no parity proof
_NB03_SMALL = dict(num_users=200, num_movies=100, eval_users=50, epochs=1, max_steps=4, run_parity=False)
# notebook 10 at a small size: no compilation (its check is not the one under test), one resume
_NB10_SMALL = dict(steps=8, compile_model=False, profile_steps=1, resume_world_sizes=[1])

# What a rank sees when output_dir is on another node's disk: the launch's `shared` option marks the folder,
# and the marker is gone before the ranks look (helpers.launch marks through its own shared_paths).
_UNSEEN_OUTPUT_DIR = (
    "import contextlib, os\n"
    "import helpers.launch\n"
    "_marking = helpers.launch.shared_paths\n"
    "@contextlib.contextmanager\n"
    "def _unseen(**paths):\n"
    "    with _marking(**paths) as marked:\n"
    "        for item in marked.paths:\n"
    "            if item.name == 'output_dir':\n"
    "                os.remove(item.marker)\n"
    "        yield marked\n"
    "helpers.launch.shared_paths = _unseen\n")

# notebook 05 on the shipped chat data (tests/data/chat_facts.jsonl) with its own tiny model
_NB05_CHAT = dict(data_path=str(NOTEBOOKS_DIR.parent / "tests" / "data" / "chat_facts.jsonl"), processes=2,
                  n_test=16, batch_size=8, epochs=3, lr=1e-3, max_length=256, run_parity=False)

# notebook 05's loading line, in each rank
_NB05_LOAD = ('    model = AutoModelForCausalLM.from_pretrained(model_path, dtype={"bf16": torch.bfloat16, '
              '"fp16": torch.float16}.get(precision))\n')

# the shipped chat data (tests/data/chat_facts.jsonl), as notebook 08 reads it (data_path)
_CHAT_FACTS = str(NOTEBOOKS_DIR.parent / "tests" / "data" / "chat_facts.jsonl")

PRETRAINED_LOOKING = "pretrained-looking:"   # + "llama" or "gpt-oss": see _resolve

MUTATIONS = [
    Mutation("00_getting_started", "an all_reduce that is never called",
             "    dist.all_reduce(value)   # the default operation: the sum over every rank",
             "    pass",
             r"all_reduce did not sum over the ranks", slow=True),
    Mutation("00_getting_started", "a restart that never happens (no rank fails on the first attempt)",
             "    if ctx.rank == ctx.world_size - 1 and ctx.attempt == 0:", "    if False:",
             r"every rank should finish on attempt 1", dict(max_steps=5), slow=True),
    Mutation("03_lightning_two_tower_mds", "Lightning in its own environment, not torch elastic's",
             '        placement = ray_placement() if on_ray else dict(devices=ctx.local_world_size, '
             'num_nodes=1, strategy="ddp")',
             "        from lightning.pytorch.plugins.environments import LightningEnvironment\n"
             '        placement = ray_placement() if on_ray else dict(devices=ctx.local_world_size, '
             'num_nodes=1, strategy="ddp", plugins=[LightningEnvironment()])',
             r"on this machine it must run DDPStrategy in TorchElasticEnvironment",
             _NB03_SMALL,
             slow=True),
    Mutation("05_deepspeed_zero_sft", "output_dir on storage the ranks' nodes do not see",
             "results = train.options(shared=shared).distributed()",
             # what a rank sees when output_dir is another node's: the launch's marker is not there
             "import contextlib, os\nimport helpers.launch as launch_module\n"
             "marked_by_launch = launch_module.shared_paths\n"
             "@contextlib.contextmanager\n"
             "def output_dir_unseen(**paths):\n"
             "    with marked_by_launch(**paths) as marked:\n"
             "        [os.remove(p.marker) for p in marked.paths if p.name == 'output_dir']\n"
             "        yield marked\n"
             "launch_module.shared_paths = output_dir_unseen\n"
             "results = train.options(shared=shared).distributed()",
             r"cannot see the folder output_dir=.*storage every node reaches",
             dict(n_train=64, n_test=8, epochs=1, max_steps=2, run_parity=False), slow=True),
    Mutation("07_trl_sft_gpt_oss", "output_dir on storage the ranks' nodes do not see",
             "results = train.options(shared=shared).distributed()",
             # what a rank sees when output_dir is another node's: the launch marks it, the rank finds no mark
             "import contextlib, os, helpers.launch\n"
             "marking = helpers.launch.shared_paths\n"
             "@contextlib.contextmanager\n"
             "def marked_elsewhere(**paths):\n"
             "    with marking(**paths) as marked:\n"
             "        os.remove(marked.paths[-1].marker)\n"
             "        yield marked\n"
             "helpers.launch.shared_paths = marked_elsewhere\n"
             "results = train.options(shared=shared).distributed()",
             r"cannot see the folder output_dir=.*storage every node reaches",
             dict(n_train=64, n_test=8, epochs=1, max_steps=2, run_parity=False), slow=True),
    Mutation("05_deepspeed_zero_sft", "the held-out loss scored on the model before fine-tuning",
             '            evaluation["after"] = evaluate_in_ranks(model, tokenizer, test_rows, '
             'device=args.device)',
             '            evaluation["after"] = dict(evaluate_in_ranks(model, tokenizer, test_rows, '
             'device=args.device),\n'
             '                                       loss=evaluation["before"]["loss"])',
             r"the held-out loss did not fall", _NB05_CHAT, slow=True),
    Mutation("05_deepspeed_zero_sft",
             "the SFTConfig created after from_pretrained: every rank loads the whole model",
             _NB05_LOAD,
             "    from transformers.integrations.deepspeed import set_hf_deepspeed_config, "
             "unset_hf_deepspeed_config\n"
             "    unset_hf_deepspeed_config()   # as if SFTConfig were created after from_pretrained\n"
             f"{_NB05_LOAD}    set_hf_deepspeed_config(args.hf_deepspeed_config)\n",
             r"not about 1/2 each: the model was loaded whole on every rank, not partitioned by zero.Init",
             dict(n_train=64, n_test=8, epochs=1, max_steps=2, run_parity=False), slow=True),
    Mutation("05_deepspeed_zero_sft", "the built-in task's 4x demand applied to chat data",
             "built_in=model_name is None and data_path is None,", "built_in=True,",
             r"training loss did not fall 4x", _NB05_CHAT, slow=True),
    Mutation("08_unsloth_llama", "each rank's held-out loss of its own share only (none over the ranks)",
             "        result.update(before=before, after=evaluate_in_ranks(trainer.model, tokenizer, "
             "cfg[\"test_rows\"], answer=answer))\n",
             "        from helpers.integrations.transformers import answer_loss, rank_share\n"
             "        after = evaluate_in_ranks(trainer.model, tokenizer, cfg['test_rows'], answer=answer)\n"
             "        own = answer_loss(trainer.model, tokenizer, rank_share(cfg['test_rows'])[0])\n"
             "        result.update(before=before, after=dict(after, loss=own))\n",
             r"the ranks' held-out figures differ", dict(max_steps=2, n_train=64, n_test=8), slow=True),
    Mutation("08_unsloth_llama", "the base model loaded in the kernel with model_name given",
             "results = fine_tune.distributed(cfg, max_steps or -1)\n",
             "from transformers import AutoModelForCausalLM\n"
             "base_model = AutoModelForCausalLM.from_pretrained(model_path)\n"
             "results = fine_tune.distributed(cfg, max_steps or -1)\n",
             r"this kernel holds model weights \(\['base_model'\]\) although model_name is given",
             dict(model_name=PRETRAINED_LOOKING + "llama", data_path=_CHAT_FACTS, processes=2, n_test=16,
                  batch_size=8, epochs=1, lr=1e-3, max_length=256), slow=True),
    Mutation("02_ddp_retinanet", "the output folder on a disk the ranks' node does not see",
             "results = train.options(shared=shared).distributed(cfg, coco, coco.num_classes)",
             # the launch marks the shared paths; a rank on a node without output_dir does not see its marker
             "import contextlib, os, helpers.launch\n"
             "marking = helpers.launch.shared_paths\n"
             "@contextlib.contextmanager\n"
             "def unseen_output_dir(**paths):\n"
             "    with marking(**paths) as marked:\n"
             "        [os.remove(p.marker) for p in marked.paths if p.name == 'output_dir']\n"
             "        yield marked\n"
             "helpers.launch.shared_paths = unseen_output_dir\n"
             "results = train.options(shared=shared).distributed(cfg, coco, coco.num_classes)",
             r"cannot see the folder output_dir=.*storage every node reaches",
             dict(n_train=16, n_val=8, epochs=1, max_steps=2, parity_steps=1), slow=True),
    Mutation("04_fsdp_transformer", "the checkpoint folder on a disk the ranks' node does not see",
             'results = train.options(shared=dict(data, output_dir=output / "main")).distributed(cfg)\n',
             _UNSEEN_OUTPUT_DIR
             + 'results = train.options(shared=dict(data, output_dir=output / "main")).distributed(cfg)\n',
             r"cannot see the folder output_dir=.*storage every node reaches",
             dict(_NB04_SMALL), slow=True),
    Mutation("10_fast_and_elastic", "output_dir on a disk the ranks' node does not see",
             "baseline = run(keep_weights=True)",
             _UNSEEN_OUTPUT_DIR + "baseline = run(keep_weights=True)",
             r"cannot see the folder output_dir=.*storage every node reaches",
             dict(_NB10_SMALL), slow=True),
    Mutation("06_ray_train_resnet", "output_dir on a disk the workers' node does not see",
             "shared=session.mark(output_dir=storage))",
             # what a worker sees when output_dir is another node's: the folder without the kernel's mark
             "shared=(marked := session.mark(output_dir=storage), "
             "[Path(item.marker).unlink() for item in marked.paths])[0])",
             r"cannot see the folder output_dir=.*paths the ranks read or write must be on storage every",
             dict(epochs=1, max_steps=2, fail_at_epoch=None, n_train=256, n_val=64, n_test=64),
             slow=True),
    Mutation("08_unsloth_llama", "the model folder on a disk the ranks' node does not see",
             "results = fine_tune.distributed(cfg, max_steps or -1)\n",
             # the launch marks the folders (its `shared` option); a rank on another node sees no marker
             "import contextlib, os, helpers.launch\n"
             "marks = helpers.launch.shared_paths\n"
             "@contextlib.contextmanager\n"
             "def unseen(**paths):\n"
             "    with marks(**paths) as marked:\n"
             "        for item in marked.paths:\n"
             "            os.remove(item.marker)\n"
             "        yield marked\n"
             "helpers.launch.shared_paths = unseen\n"
             "results = fine_tune.distributed(cfg, max_steps or -1)\n",
             r"cannot see the folder model=.*paths the ranks read or write must be on storage every node",
             dict(max_steps=2, n_train=64, n_test=8), slow=True),
    # the launch option `shared` marks the paths inside the launch: the mutation makes the kernel's marks
    # vanish before the ranks look, as on a node that does not mount the disk
    Mutation("09_axolotl_olmo3", "the model folder on a disk the ranks' node does not see",
             '    results = train_with_axolotl.distributed(for_ranks(config_path))\n',
             '    import contextlib, helpers.launch, os\n'
             '    marks = helpers.launch.shared_paths\n'
             '    @contextlib.contextmanager\n'
             '    def on_another_node(**paths):\n'
             '        with marks(**paths) as marked:\n'
             '            for item in marked.paths:\n'
             '                if item.marker:\n'
             '                    os.remove(item.marker)\n'
             '            yield marked\n'
             '    helpers.launch.shared_paths = on_another_node\n'
             '    results = train_with_axolotl.distributed(for_ranks(config_path))\n',
             r"cannot see the folder model=.*paths the ranks read or write must be on storage every node",
             dict(max_steps=2, n_test=8), slow=True),
    Mutation("01_ddp_mlp", "the ranks' gradients summed instead of averaged",
             "            scaler.scale(loss).backward()  # DDP all-reduces (averages) the gradients here",
             "            scaler.scale(loss * ctx.world_size).backward()",
             r"1 vs 2 processes differ by", dict(epochs=1, max_steps=2)),
    Mutation("01_ddp_mlp", "a rank that skips the all-reduce",
             "            with torch.autocast(device.type, precision.autocast_dtype, "
             "enabled=precision.autocast_dtype is not None):\n"
             "                loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))\n"
             "            scaler.scale(loss).backward()  # DDP all-reduces (averages) the gradients here",
             # no_sync must cover the forward pass: DDP decides there whether the backward all-reduces
             "            with model.no_sync(), torch.autocast(device.type, precision.autocast_dtype, "
             "enabled=precision.autocast_dtype is not None):\n"
             "                loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))\n"
             "                scaler.scale(loss).backward()",
             r"1 vs 2 processes differ by", dict(epochs=1, max_steps=2), slow=True),
    Mutation("01_ddp_mlp", "no set_epoch: every epoch in the same order",
             "        sampler.set_epoch(epoch)          "
             "# a different shuffle each epoch, the same on every rank\n",
             "",
             r"two epochs read the data in the same order", dict(epochs=2, max_steps=4, parity_steps=2),
             slow=True),
    Mutation("01_ddp_mlp", "an untrained model logged in place of the trained one",
             'logged = log_model(model, "01_ddp_mlp", examples=X_test[:8], register_as=register_as)',
             'logged = log_model(MLP(X_train.shape[1], hidden_size, num_classes), "01_ddp_mlp", '
             'examples=X_test[:8], register_as=register_as)',
             r"the loaded model does not give the evaluation's answers",
             dict(epochs=1, max_steps=30, parity_steps=2),
             slow=True),
    Mutation("04_fsdp_transformer", "FSDP summing the ranks' gradients instead of averaging them",
             "        scaler.scale(loss).backward()                     "
             "# FSDP reduce-scatters the gradients here",
             # what a sum reduction does: every rank's gradient counted in full, N times the mean (FSDP only)
             "        scaler.scale(loss * (ctx.world_size if cfg['strategy'] == 'fsdp' else 1)).backward()",
             r"FSDP and DDP losses differ by",
             dict(steps=30, checkpoint_every=10, max_steps=2, fail_at_step=None, eval_batches=1), slow=True),
    Mutation("04_fsdp_transformer", "a resume that restores nothing into the model being trained",
             "    resumed = checkpoints.resume(model, optimizer)",
             "    resumed = checkpoints.resume(*shard(cfg, device, precision))   # a throwaway model",
             r"resumed run differs from the uninterrupted one",
             dict(steps=30, checkpoint_every=10, fail_at_step=15, parity_steps=2, eval_batches=1), slow=True),
    Mutation("04_fsdp_transformer", "an untrained model logged in place of the gathered, trained one",
             'logged = log_model(sampler, "04_fsdp_transformer",',
             'logged = log_model(GPT(config), "04_fsdp_transformer",',
             r"the loaded model does not give the evaluation's answers",
             _NB04_SMALL, slow=True),
    Mutation("04_fsdp_transformer", "the memory plan given the wrong world size",
             "pair_world_size = fsdp_run[\"world_size\"]   # the comparison runs' ranks, as they reported it",
             "pair_world_size = 2 * fsdp_run[\"world_size\"]",
             r"measured per-rank model state differs from helpers.memory_plan's plan",
             _NB04_SMALL, slow=True),
    Mutation("02_ddp_retinanet", "an untrained model logged in place of the trained one",
             'logged = log_model(model, "02_ddp_retinanet", examples=examples, register_as=register_as,',
             'logged = log_model(build_retinanet(coco.num_classes, **cfg), "02_ddp_retinanet", '
             'examples=examples, register_as=register_as,',
             r"the loaded model does not give the evaluation's detections",
             dict(epochs=1, max_steps=2, parity_steps=2), slow=True),
    Mutation("10_fast_and_elastic", "an untrained model logged in place of the trained one",
             'logged = log_model(model, "10_fast_and_elastic",',
             'logged = log_model(GPT(config), "10_fast_and_elastic",',
             r"the loaded model does not give the evaluation's answers", _NB10_SMALL, slow=True),
    Mutation("03_lightning_two_tower_mds", "an untrained model logged in place of the trained one",
             'logged = log_model(Recommender(model).eval(), "03_lightning_two_tower_mds", '
             'examples=example_users,',
             "logged = log_model(Recommender(TwoTower(**tables, embed_dim=embed_dim)).eval(), "
             '"03_lightning_two_tower_mds", examples=example_users,',
             r"the loaded model does not give the evaluation's top 10",
             _NB03_SMALL,
             slow=True),
    Mutation("05_deepspeed_zero_sft", "an untrained model logged in place of the fine-tuned one",
             "logged = log_model(str(Path(output_dir).resolve()),",
             "logged = log_model(str(Path(model_path).resolve()),",
             r"the loaded model does not give the evaluation's answers",
             dict(processes=1, n_train=128, n_test=8, epochs=1, max_steps=30, run_parity=False), slow=True),
    Mutation("05_deepspeed_zero_sft", "the stage runs all under stage 0: nothing sharded, the same steps",
             "    parity = {s: fine_tune(s, rows,",
             "    parity = {s: fine_tune(0, rows,",
             r"away from the memory plan's figure",
             dict(n_train=64, n_test=8, epochs=1, max_steps=2, parity_steps=2), slow=True),
    Mutation("05_deepspeed_zero_sft", "ZeRO-3 keeping every small parameter whole on every rank",
             "zero.update(stage3_param_persistence_threshold=0,",
             "zero.update(",
             r"away from the memory plan's figure",
             dict(n_train=64, n_test=8, epochs=1, max_steps=2, parity_steps=2), slow=True),
    Mutation("08_unsloth_llama", "the ranks' adapters without the embeddings the plan trains in full",
             '            target_modules=cfg["lora_target_modules"] + full, use_gradient_checkpointing',
             '            target_modules=cfg["lora_target_modules"], use_gradient_checkpointing',
             r"the ranks' LoRA configuration is not the one planned", dict(max_steps=2, n_test=8), slow=True),
    Mutation("08_unsloth_llama", "an untrained model logged in place of the fine-tuned one",
             "merged = finetuned.merge_and_unload()",
             "from transformers import AutoModelForCausalLM; "
             "merged = AutoModelForCausalLM.from_pretrained(model_path)",
             r"the loaded model does not give the evaluation's answers", dict(max_steps=100, n_test=8),
             slow=True),
    Mutation("09_axolotl_olmo3", "Axolotl's YAML without the embeddings the plan trains in full",
             'lora_modules_to_save: {json.dumps(["embed_tokens", "lm_head"] if embeddings else None)}\n',
             "lora_modules_to_save: null\n",
             r"Axolotl's LoRA configuration is not the one planned", dict(max_steps=2, n_test=8), slow=True),
    Mutation("09_axolotl_olmo3", "an untrained model logged in place of the fine-tuned one",
             'logged = log_model(merged_dir, "09_axolotl_olmo3",',
             'logged = log_model(local_model, "09_axolotl_olmo3",',
             r"the loaded model does not give the evaluation's answers", dict(max_steps=100, n_test=8),
             slow=True),
    Mutation("06_ray_train_resnet", "an untrained model logged in place of the trained one",
             'logged = log_model(model, "06_ray_train_resnet",',
             'logged = log_model(make_resnet().eval(), "06_ray_train_resnet",',
             r"the loaded model does not give the evaluation's answers",
             dict(epochs=1, max_steps=16, fail_at_epoch=None, n_val=64, n_test=64), slow=True),
    Mutation("07_trl_sft_gpt_oss", "a memory plan that forgets FSDP shards the model state over the ranks",
             'model_state_bytes(counts, s, world_size=len(results), optimizer="sgd")',
             'model_state_bytes(counts, s, world_size=1, optimizer="sgd")',
             r"FSDP: the ranks held .* bytes of model state, memory_plan plans", dict(max_steps=2, n_test=10),
             slow=True),
    Mutation("07_trl_sft_gpt_oss", "twice the layers in flight: more than an 80 GB GPU holds at 120B",
             'in_flight = float(measured["in_flight_layers"].max())',
             'in_flight = 2 * float(measured["in_flight_layers"].max())',
             r"the advertised gpt-oss-120b command needs .* GB a GPU by the measured figures",
             dict(processes=1, run_parity=False, max_steps=2, n_test=8), slow=True),
    Mutation("07_trl_sft_gpt_oss", "an untrained model logged in place of the fine-tuned one",
             'to_log = {"model": finetuned, "tokenizer": finetuned_tokenizer}',
             'to_log = {"model": AutoModelForCausalLM.from_pretrained(model_path, '
             '**load_options(model_path, eval_dtype)), "tokenizer": finetuned_tokenizer}',
             r"the loaded model does not give the evaluation's answers",
             dict(processes=1, run_parity=False, max_steps=6, n_test=16), slow=True),
    Mutation("02_ddp_retinanet", "the ranks' gradients summed instead of averaged",
             "        loss.backward()                          # DDP averages the ranks' gradients here",
             "        (loss * ctx.world_size).backward()",
             r"1 and 2 processes differ by", dict(epochs=1, max_steps=2), slow=True),
    Mutation("03_lightning_two_tower_mds", "the ranks' gradients summed instead of averaged",
             "        return loss\n\n    def validation_step",
             "        return loss * self.trainer.world_size\n\n    def validation_step",
             r"2 DDP ranks and 1 accumulating process differ by", dict(epochs=1, max_steps=4), slow=True),
    Mutation("05_deepspeed_zero_sft", "ZeRO 1-3 normalising by half the tokens (steps twice the size)",
             "    trainer = with_step_losses(SFTTrainer)(",
             "    class HalfTheTokens(with_step_losses(SFTTrainer)):\n"
             "        def training_step(self, model, inputs, num_items_in_batch=None):\n"
             "            return super().training_step(model, inputs, num_items_in_batch if stage == 0\n"
             "                                         else num_items_in_batch / 2)\n\n"
             "    trainer = HalfTheTokens(",
             r"ZeRO stages differ from stage 0 by", dict(max_steps=2, n_test=10), slow=True),
    Mutation("07_trl_sft_gpt_oss", "FSDP summing the ranks' gradients instead of averaging them",
             "    trainer.train()\n",
             # what a sum reduction does: every sharded (FSDP) gradient N times the mean; DDP's untouched
             "    from transformers import TrainerCallback\n\n"
             "    class SumOfRanks(TrainerCallback):\n"
             "        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):\n"
             "            [p.grad.mul_(args.world_size) for p in model.parameters()\n"
             "             if p.grad is not None and hasattr(p.grad, 'to_local')]\n"
             "    trainer.add_callback(SumOfRanks())\n"
             "    trainer.train()\n",
             r"FSDP and DDP losses differ by", dict(max_steps=2, n_test=10), slow=True),
    Mutation("08_unsloth_llama", "ranks that never all-reduce (each steps on its own gradients)",
             "    trainer = with_step_losses(SFTTrainer)(",
             "    class NoSync(SFTTrainer):\n"
             "        def training_step(self, model, inputs, num_items_in_batch=None):\n"
             "            with model.no_sync():   # model: the DDP wrapper TRL made\n"
             "                return super().training_step(model, inputs, num_items_in_batch)\n"
             "    trainer = with_step_losses(NoSync)(",
             r"the ranks ended with different adapters", dict(max_steps=2, n_test=8), slow=True),
    Mutation("09_axolotl_olmo3", "LoRA alone on the random tiny model (its embeddings left frozen)",
             'lora_modules_to_save: {json.dumps(["embed_tokens", "lm_head"] if embeddings else None)}\n',
             "lora_modules_to_save: null\n",
             r"training loss did not fall", {}, slow=True),
    Mutation("10_fast_and_elastic", "accumulation that forgets to divide each micro-batch's loss",
             "                        scaler.scale(loss / micro).backward()   "
             "# 1/micro each: the step's mean loss",
             "                        scaler.scale(loss).backward()",
             r"accumulated steps differ from one-piece steps", _NB10_SMALL, slow=True),
    Mutation("10_fast_and_elastic", "no_sync never entered: every micro-batch all-reduced",
             "                keep_local = cfg[\"accumulate\"] == \"no_sync\" and i < micro - 1 and "
             "cfg[\"strategy\"] == \"ddp\"",
             "                keep_local = False",
             r"no_sync did not skip the all-reduces", _NB10_SMALL, slow=True),
    Mutation("10_fast_and_elastic", "no_sync on the first micro-batch only: fewer all-reduces than naive, "
             "more than one piece",
             "                keep_local = cfg[\"accumulate\"] == \"no_sync\" and i < micro - 1 and "
             "cfg[\"strategy\"] == \"ddp\"",
             "                keep_local = cfg[\"accumulate\"] == \"no_sync\" and i == 0 and i < micro - 1 "
             "and cfg[\"strategy\"] == \"ddp\"",
             r"no_sync did not skip the all-reduces", _NB10_SMALL, slow=True),
    Mutation("06_ray_train_resnet", "a resume that restores only the epoch counter",
             "        model.module.load_state_dict(state[\"model\"])\n"
             "        optimizer.load_state_dict(state[\"optimizer\"])\n"
             "        scheduler.load_state_dict(state[\"scheduler\"])\n",
             "",
             r"weights not restored", dict(epochs=2, n_train=512), slow=True),
]



def _reference_guards() -> list[Mutation]:
    """Each reference file's named regression, at the default parameters (where the reference is compared):
    the notebook's bars let it pass, and the reference check must stop it."""
    guards = []
    for path in sorted(REFERENCES_DIR.glob("[0-9][0-9]_*.json")):
        guard = json.loads(path.read_text()).get("guard")
        if guard and not guard.get("too_wide"):  # too wide: the file says the check cannot catch it
            guards.append(Mutation(path.stem, f"reference guard: {guard['regression']}", guard["original"],
                                   guard["mutated"], r"moved away from its reference runs", {}, slow=True))
    return guards


MUTATIONS += _reference_guards()


def _mutated_copy(mutation: Mutation, folder) -> str:
    source = NOTEBOOKS_DIR / f"{mutation.notebook}.ipynb"
    nb = nbformat.read(str(source), as_version=4)
    hits = [c for c in nb.cells if c.cell_type == "code" and mutation.original in c.source]
    assert len(hits) == 1 and hits[0].source.count(mutation.original) == 1, (
        f"{mutation.notebook}: the line to mutate is not there exactly once; update the mutation")
    hits[0].source = hits[0].source.replace(mutation.original, mutation.mutated)
    path = folder / source.name
    nbformat.write(nb, str(path))
    return str(path)


@pytest.mark.parametrize(
    "mutation",
    [pytest.param(m, marks=[pytest.mark.mutation] if m.slow else []) for m in MUTATIONS],
    ids=lambda m: f"{m.notebook}: {m.why}",
)
def test_the_check_catches_the_bug(mutation, tmp_path):
    from papermill.exceptions import PapermillExecutionError

    path = _mutated_copy(mutation, tmp_path)
    parameters = {k: _resolve(v) for k, v in mutation.parameters.items()}
    with pytest.raises(PapermillExecutionError, match=mutation.expected):
        execute_notebook(path, tmp_path / "out.ipynb", parameters, timeout=900)


def _resolve(value):
    """A parameter built when the test runs, not when the module is collected: `PRETRAINED_LOOKING + arch`
    is the folder of tests/data/chat_facts.py's warmed-up model (built once, then cached)."""
    if isinstance(value, str) and value.startswith(PRETRAINED_LOOKING):
        from tests.data.chat_facts import pretrained_looking

        return str(pretrained_looking(value.removeprefix(PRETRAINED_LOOKING)))
    return value
