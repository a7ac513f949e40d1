"""Logging the trained model to its run, registering it, and moving the `champion` alias.

The model is logged as a plain `torch.nn.Module` (the network without Lightning), with a
signature and an input example, so `mlflow.pyfunc.load_model("models:/<name>@champion")`
predicts class logits from a float32 feature matrix anywhere torch is installed. The class
labels travel as model metadata. A new version becomes `champion` only if its validation
macro-F1 beats the current champion's; otherwise it is the `challenger`.
"""

from __future__ import annotations

from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.models import infer_signature
from mlflow.tracking import MlflowClient

from tracking.config import TrackingConfig

SCORE_TAG = "ballast.val_macro_f1"


def log_model(config: TrackingConfig, run_id: str, network: torch.nn.Module,
              example: np.ndarray, classes: list[str]) -> str:
    """Log `network` under the run; returns the model URI to register."""
    mlflow.set_tracking_uri(config.tracking_uri)
    network = network.eval().cpu()
    with torch.no_grad():
        output = network(torch.from_numpy(example)).numpy()
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pytorch.log_model(
            network, name="model", signature=infer_signature(example, output),
            input_example=example, metadata={"classes": classes},
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
        )
    return str(info.model_uri)


def champion_score(client: MlflowClient, name: str) -> float | None:
    """Validation macro-F1 of the current champion, or None when there is none."""
    try:
        version = client.get_model_version_by_alias(name, "champion")
    except mlflow.exceptions.MlflowException:
        return None
    score = version.tags.get(SCORE_TAG)
    return float(score) if score is not None else None


def register_and_promote(config: TrackingConfig, model_uri: str, name: str,
                         score: float) -> dict[str, Any]:
    """Register `model_uri` as a new version of `name`; alias it champion if it wins."""
    client = MlflowClient(config.tracking_uri)
    mlflow.set_tracking_uri(config.tracking_uri)
    version = mlflow.register_model(model_uri, name, tags={SCORE_TAG: str(score)})
    previous = champion_score(client, name)
    alias = "champion" if previous is None or score > previous else "challenger"
    client.set_registered_model_alias(name, alias, version.version)
    return {"name": name, "version": int(version.version), "alias": alias,
            "score": score, "previous_champion_score": previous}
