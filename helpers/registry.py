"""Log a trained model to MLflow, register it, and load it back: the "Use the trained model" step of every
lesson.

Each notebook ends by proving that what it trained can be used without the notebook: the model is logged
with a signature and an input example, registered under `register_as` when given, loaded back by its URI
(nothing of the notebook's objects reused), and the loaded model must give the answers the notebook's own
evaluation gave. The last part is the lesson's and stays in the notebook; this module is the MLflow plumbing
around it:

    logged = log_model(model, "01_ddp_mlp", examples=X_test[:8], register_as=register_as)
    loaded = logged.load()                                   # a fresh model, from MLflow
    assert (loaded(torch.from_numpy(X_test[:8])).argmax(1).numpy() == predictions[:8]).all()

With tracking on (see `helpers.tracking`), the model goes into a run of the notebook's experiment in the
store the gallery uses (or into `run_id`, a run the notebook's own logger made, such as Lightning's
MLFlowLogger), and `models:/<register_as>/<version>` is where it loads from once registered. With tracking
off (`GALLERY_TRACKING=off`, as in the tests), it is saved in the same MLflow format to a temporary folder
and loaded from there, so the round trip is proven either way.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import tracking
from helpers.logs import quieted

FLAVORS = ("pytorch", "transformers", "files")
INPUTS_ONLY = "inputs"   # log_model(signature=...): a signature of the inputs alone
# MLflow's INFO lines about its store, and mlflow.transformers' notes about a model card or license it cannot
# fetch offline, are about MLflow, not the lesson.
QUIET = ("mlflow", "alembic", "mlflow.transformers", "mlflow.models.model", "mlflow.store")


@dataclass(frozen=True)
class LoggedModel:
    """Where a logged model lives and how to load it back."""

    uri: str                # models:/<name>/<version>, the run's copy, or a local folder (tracking off)
    flavor: str             # "pytorch", "transformers" or "files" (a folder logged as artifacts)
    run_id: str | None      # the MLflow run it went into; None with tracking off
    registered: bool = False
    load_options: dict[str, Any] = field(default_factory=dict)

    def load(self, **options: Any) -> Any:
        """The model, loaded fresh from MLflow by the flavor it was logged with."""
        if self.flavor == "files":
            raise TypeError(f"{self.uri} holds files logged as artifacts, not a model MLflow can load: "
                            "download them with mlflow.artifacts.download_artifacts(artifact_uri=...).")
        module = _flavor_module(self.flavor)
        with _quiet():
            return module.load_model(self.uri, **{**self.load_options, **options})


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with quieted(QUIET, logging.ERROR), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")   # tqdm, imported by MLflow
        warnings.filterwarnings("ignore", category=FutureWarning, module="mlflow")
        yield


def _flavor_module(flavor: str) -> Any:
    if flavor not in FLAVORS:
        raise ValueError(f"flavor={flavor!r}: use one of {', '.join(map(repr, FLAVORS))}.")
    with _quiet():
        import mlflow.pytorch
        if flavor == "transformers":
            import mlflow.transformers

            return mlflow.transformers
    return mlflow.pytorch


def requirements_of(flavor: str, extra: Sequence[str] = ()) -> list[str]:
    """The pins a logged model needs (torch's version without its local '+cu...' part), and `extra`."""
    from importlib.metadata import version

    pins = [f"torch=={version('torch').split('+')[0]}"]
    if flavor == "transformers":
        pins.append(f"transformers=={version('transformers')}")
    return pins + list(extra)


def _signature(model: Any, flavor: str, examples: Any, outputs: Any) -> Any:
    """The model's input/output signature from the examples; a torch model's outputs are computed here."""
    if examples is None:
        return None
    from mlflow.models import infer_signature

    if outputs is None and flavor == "pytorch":
        import numpy as np
        import torch

        with torch.no_grad():
            outputs = model(torch.as_tensor(np.asarray(examples))).detach().cpu().numpy()
    return infer_signature(examples, outputs)


def log_model(model: Any, notebook: str, *, examples: Any = None, outputs: Any = None,
              register_as: str | None = None, flavor: str = "pytorch", run_id: str | None = None,
              run_name: str | None = None, tracking_uri: str | None = None, requirements: Sequence[str] = (),
              tags: dict[str, str] | None = None, signature: Any = None, **options: Any) -> LoggedModel:
    """Log `model` to MLflow (a run of experiment `notebook`, or `run_id`), register it, and say where it is.

    `model`: a torch module (flavor "pytorch"); a transformers components dict or a saved folder (flavor
    "transformers", with `task=...` and other `mlflow.transformers` options); or a folder logged as it is
    (flavor "files", e.g. a LoRA adapter of a base model the store does not hold). `examples` (and `outputs`,
    computed for a torch model when not given) become the signature and input example. `signature`, given,
    replaces that signature: an MLflow `ModelSignature` as it is, or "inputs" for one of `examples` alone (a
    model whose output no signature describes, such as a detector's list of dicts of any number of boxes).
    Call `tracking.check_register_as(register_as)` before training, so that a bad name fails early.
    """
    module = _flavor_module(flavor) if flavor != "files" else None
    with _quiet():
        if signature == INPUTS_ONLY and module is not None:
            from mlflow.models import infer_signature

            signature = infer_signature(examples)
        elif signature is None and module is not None:
            signature = _signature(model, flavor, examples, outputs)
        save_options = {} if module is None else dict(
            options, signature=signature, input_example=examples,
            pip_requirements=requirements_of(flavor, requirements))
        if tracking.enabled():
            return _log(model, notebook, module, flavor, save_options, register_as=register_as, run_id=run_id,
                        run_name=run_name, tracking_uri=tracking_uri, tags=tags or {})
        if module is None:   # nothing to copy: the folder is where it stays
            print(f"tracking is off ({tracking.ENV_SWITCH}=off): the files stay in {model}")
            return LoggedModel(str(model), flavor, None)
        folder = str(Path(tempfile.mkdtemp(prefix=f"{notebook}-model-")) / "model")
        module.save_model(model, folder, **save_options)
    print(f"tracking is off ({tracking.ENV_SWITCH}=off): the model is saved in MLflow's format to a local "
          "folder")
    return LoggedModel(folder, flavor, None)


def _log(model: Any, notebook: str, module: Any, flavor: str, save_options: dict[str, Any], *,
         register_as: str | None, run_id: str | None, run_name: str | None, tracking_uri: str | None,
         tags: dict[str, str]) -> LoggedModel:
    import mlflow

    store = tracking.resolve_tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(store)
    if run_id is None:
        mlflow.set_experiment(experiment_id=tracking.create_experiment(notebook, store))
    with mlflow.start_run(run_id=run_id, run_name=None if run_id else (run_name or notebook)) as run:
        if tags:
            mlflow.set_tags(tags)
        if module is None:
            mlflow.log_artifacts(str(model), "files")
            uri, registered = f"runs:/{run.info.run_id}/files", False
        else:
            info = module.log_model(model, name="model", registered_model_name=register_as, **save_options)
            uri = tracking.logged_model_uri(info, register_as)
            registered = uri.startswith("models:/")
    print(f"logged to MLflow run {run.info.run_id} as {uri}")
    return LoggedModel(uri, flavor, run.info.run_id, registered)
