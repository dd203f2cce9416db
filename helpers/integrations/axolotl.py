"""The gallery's Axolotl plugin, in every rank: rank 0's progress bar in the cell, what each rank trained, and
Axolotl 0.13.2 on CPU ranks.

Axolotl loads the plugins its YAML names (`plugins: [helpers.integrations.axolotl.GalleryPlugin]`) in every
rank, and calls their hooks as it goes. This one uses three:

- `register` (while `load_cfg` reads the YAML) and `load_datasets` (the first hook `do_train` calls with the
  finished config): on ranks without a GPU, the two places where Axolotl 0.13.2 assumes one. Its `load_cfg`
  asks CUDA whether the GPUs reach each other (`check_cuda_p2p_ib_support`) whenever WORLD_SIZE > 1, which
  fails without a driver; and it maps rank r to `cuda:r` (`device_map = {"": LOCAL_RANK}`), which
  `from_pretrained` then cannot place. Its launcher (`axolotl train --launcher torchrun`) offers no way
  around either. On GPUs the plugin changes nothing here.
- `add_callbacks_post_trainer`: two `transformers` callbacks, the gallery's progress bar (Axolotl's own tqdm
  bar would arrive in the notebook as a pile of half lines through the ranks' log tail) and a recorder.
  `axolotl.cli.train.do_train` returns nothing and drops its trainer, so the recorder keeps, in `RECORD`,
  what the notebook checks afterwards: the loss Axolotl logged at every step, when each step ended, the
  wrapper the model trained in (DDP or not), the number of trainable parameters and a fingerprint of their
  final values (under DDP, every rank's must be the same), the node and the versions.

Importable only where Axolotl is installed (notebook 09's environment, envs/axolotl). The kernel's side of the
same lesson (Axolotl's environment, its Ray path) is `helpers.integrations.axolotl_launch`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import time
from typing import Any

from axolotl.integrations.base import BasePlugin

from helpers.integrations.transformers import transformers_progress_callback

RECORD: dict[str, Any] = {}


def fingerprint(model: Any) -> str:
    """sha256 of every trainable parameter's name and value: equal on two ranks only if their weights are."""
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        if p.requires_grad:
            digest.update(name.encode() + p.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def base_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def allow_cpu_ranks() -> None:
    """Axolotl's peer-access check, answered for ranks without a GPU (there is no peer to reach)."""
    import axolotl.utils.trainer

    if on_cpu():
        axolotl.utils.trainer.check_cuda_p2p_ib_support = lambda: True


def place_on_cpu(cfg: Any) -> None:
    """Every rank's model on the CPU, where Axolotl maps rank r to `cuda:r` (no GPU: nothing to do on one)."""
    if on_cpu():
        cfg.device_map = {"": "cpu"}
        cfg.device = "cpu"


def _node(cfg: Any) -> str:
    if cfg.use_ray:
        import ray

        return ray.get_runtime_context().get_node_id()
    from helpers.context import worker_context

    return worker_context().node


def _recorder(trainer: Any, cfg: Any) -> Any:
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            RECORD.clear()
            RECORD.update(step_losses=[], step_ends=[], start=time.perf_counter(),
                          precision="bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            RECORD["step_ends"].append(time.perf_counter() - RECORD["start"])

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
                   **kwargs: Any) -> None:
            if logs and "loss" in logs:   # logging_steps 1: the mean of the ranks' losses at this step
                RECORD["step_losses"].append(float(logs["loss"]))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            model = trainer.model
            RECORD.update(
                train_seconds=time.perf_counter() - RECORD.pop("start"), steps=state.global_step,
                wrapper=type(trainer.model_wrapped).__name__, fingerprint=fingerprint(model),
                trainable=sum(p.numel() for p in model.parameters() if p.requires_grad),
                total=sum(p.numel() for p in model.parameters()),
                four_bit=bool(getattr(base_model(model), "is_loaded_in_4bit", False)),
                node=_node(cfg), axolotl=importlib.metadata.version("axolotl"),
                transformers=importlib.metadata.version("transformers"),
            )
            if cfg.use_ray:   # Axolotl's Ray path returns nothing per rank: the kernel reads this file back
                _write_record(cfg.output_dir)

    return Recorder()


def _write_record(output_dir: str) -> None:
    """This rank's RECORD as <output_dir>/gallery-record-rank<RANK>.json (see axolotl_launch.train_on_ray)."""
    import json
    import os
    from pathlib import Path

    path = Path(output_dir) / f"gallery-record-rank{os.environ.get('RANK', '0')}.json"
    path.write_text(json.dumps(RECORD))


class GalleryPlugin(BasePlugin):
    """Axolotl on CPU ranks too; the progress bar and the recorder in place of Axolotl's tqdm bar."""

    def register(self, cfg: Any) -> None:
        allow_cpu_ranks()   # before load_cfg asks CUDA about peer access

    def load_datasets(self, cfg: Any, preprocess: bool = False) -> None:
        place_on_cpu(cfg)   # the config is final here, and no model is loaded yet
        return None         # Axolotl loads the YAML's datasets itself

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        from transformers import PrinterCallback, ProgressCallback

        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        return [transformers_progress_callback("Axolotl"), _recorder(trainer, cfg)]
