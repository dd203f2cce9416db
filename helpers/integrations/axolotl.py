"""An Axolotl plugin for notebook launches: rank 0's progress bar in the cell, and what each rank trained.

Axolotl loads plugins named in its YAML (`plugins: [helpers.integrations.axolotl.GalleryPlugin]`) in every
rank, and calls `add_callbacks_post_trainer` once it has built its trainer. This one adds two `transformers`
callbacks: the gallery's progress bar (Axolotl's own tqdm bar would arrive in the notebook as a pile of
half lines through the ranks' log tail) and a recorder. `axolotl.cli.train.do_train` returns nothing and drops
its trainer, so the recorder keeps, in `RECORD`, what the notebook checks afterwards: the loss Axolotl logged
at every step, when each step ended, the wrapper the model trained in (DDP or not), the number of trainable
parameters and a fingerprint of their final values (under DDP, every rank's must be the same).

Importable only where Axolotl is installed (notebook 09's environment, envs/axolotl).
"""

from __future__ import annotations

import hashlib
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
            )
            if cfg.use_ray:   # Axolotl's Ray path returns nothing per rank: the notebook reads this file back
                _write_record(cfg.output_dir)

    return Recorder()


def _write_record(output_dir: str) -> None:
    """This rank's RECORD, its Ray node and the versions, as <output_dir>/gallery-record-rank<RANK>.json."""
    import importlib.metadata
    import json
    import os
    from pathlib import Path

    import ray

    record = dict(RECORD, node=ray.get_runtime_context().get_node_id(),
                  axolotl=importlib.metadata.version("axolotl"),
                  transformers=importlib.metadata.version("transformers"))
    path = Path(output_dir) / f"gallery-record-rank{os.environ.get('RANK', '0')}.json"
    path.write_text(json.dumps(record))


class GalleryPlugin(BasePlugin):
    """Adds the progress bar and the recorder to Axolotl's trainer, and removes its tqdm bar."""

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        from transformers import PrinterCallback, ProgressCallback

        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        return [transformers_progress_callback("Axolotl"), _recorder(trainer, cfg)]
