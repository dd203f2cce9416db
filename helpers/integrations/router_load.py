"""The tokens the router of every mixture-of-experts layer sends to each expert, counted per training step
(`RouterLoad`), and the figures of a GPT-OSS run: the router's load (`plot_router_load`) and the training
and load-balancing losses (`plot_losses`).

Why: whether the experts share the work (the load-balancing loss doing its job) is what a mixture-of-experts
run shows beside its loss.
"""

from __future__ import annotations

import warnings
from typing import Any

# tqdm's notebook check, run when transformers is first imported: progress bars come from helpers
warnings.filterwarnings("ignore", message="IProgress not found")

from transformers import TrainerCallback  # noqa: E402


class RouterLoad(TrainerCallback):
    """The tokens the router of every mixture-of-experts layer sends to each expert, per training step.

    A forward hook on every router (`GptOssTopKRouter`) counts its top-k choices, padding excluded (a pre-hook
    on the input embeddings notes which tokens are padding), and not the second forward of a layer that
    gradient checkpointing recomputes in the backward pass. `counts()`: `[steps, layers, experts]`.
    """

    def __init__(self, model: Any, pad_token_id: int | None, router_class: str = "GptOssTopKRouter") -> None:
        import torch

        routers = [m for m in model.modules() if type(m).__name__ == router_class]
        if not routers:
            raise ValueError(f"the model has no {router_class}: nothing to count")
        embed = model.get_input_embeddings()
        self.pad_token_id, self.keep = pad_token_id, None
        self.current = torch.zeros(len(routers), routers[0].num_experts, dtype=torch.long)
        self.per_step: list[Any] = []
        embed.register_forward_pre_hook(self._note_padding)
        for layer, router in enumerate(routers):
            router.register_forward_hook(self._counter(layer))

    def _note_padding(self, module: Any, args: Any) -> None:
        self.keep = None if self.pad_token_id is None else (args[0] != self.pad_token_id).flatten()

    def _counter(self, layer: int) -> Any:
        import torch

        def count(module: Any, args: Any, output: Any) -> None:
            # only training forwards, and not a checkpointed layer's recomputation (run inside the backward)
            if torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
                indices = output[-1]   # the router returns (..., indices): [tokens, top_k]
                chosen = indices[self.keep] if self.keep is not None else indices
                self.current[layer] += torch.bincount(chosen.flatten().cpu(), minlength=self.current.shape[1])
        return count

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.per_step.append(self.current.clone())
        self.current.zero_()

    def counts(self) -> Any:
        """`[steps, layers, experts]` as a numpy array (None before the first step)."""
        import torch

        return torch.stack(self.per_step).numpy() if self.per_step else None


def plot_router_load(counts: Any, layer_types: list[str], most: int = 4, smooth: int = 10) -> Any:
    """The share of each layer's routed tokens each expert got, per step, smoothed over `smooth` steps: at
    most `most` layers drawn, spread over the depth. Returns the figure. `counts`: `[steps, layers,
    experts]`."""
    import matplotlib.pyplot as plt
    import numpy as np
    import pandas as pd

    n_layers, n_experts = counts.shape[1], counts.shape[2]
    shown = sorted(set(np.linspace(0, n_layers - 1, min(n_layers, most)).round().astype(int)))
    figure, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.2), squeeze=False)
    for layer, ax in zip(shown, axes[0], strict=True):
        share = pd.DataFrame(counts[:, layer, :] / counts[:, layer, :].sum(axis=1, keepdims=True))
        share = share.rolling(smooth, min_periods=1).mean()
        ax.stackplot(share.index + 1, share.T.values, labels=[f"expert {e}" for e in range(n_experts)])
        ax.set_ylim(0, 1)
        ax.set_xlabel("step")
        ax.set_ylabel("share of routed tokens")
        ax.set_title(f"layer {layer} ({layer_types[layer].replace('_', ' ')})")
    axes[0][-1].legend(loc="center left", bbox_to_anchor=(1, 0.5), fontsize=8)
    figure.tight_layout()
    return figure


def plot_losses(losses: Any, logs: Any, top_k: int, title: str) -> Any:
    """The training loss of every step (and its moving average over 25) beside the load-balancing loss the
    trainer logged (`aux_loss`, in `logs`: the trainer's log history), with the value a perfectly even router
    scores (`top_k`). Returns the figure."""
    import matplotlib.pyplot as plt

    figure, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.5))
    ax.plot(losses.index + 1, losses.values, lw=0.8, label="per step")
    ax.plot(losses.index + 1, losses.rolling(25, min_periods=1).mean(), lw=2, label="moving average (25)")
    ax.set(xlabel="step", ylabel="loss (answer tokens + aux)", yscale="log", title=title)
    if "aux_loss" in logs:
        aux = logs.dropna(subset=["aux_loss"])
        ax2.plot(aux["step"], aux["aux_loss"], marker="o", ms=3)
    ax2.axhline(top_k, color="grey", ls=":", label="perfectly even router")
    ax2.set(xlabel="step", ylabel="load-balancing loss", title="auxiliary loss (rank 0)")
    ax.legend()
    ax2.legend()
    figure.tight_layout()
    return figure
