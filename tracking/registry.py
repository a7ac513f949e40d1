"""Logging the trained model to its run, registering it, and moving the `champion` alias.

The model is logged as a plain `torch.nn.Module` (the network without Lightning), with a
signature and an input example, so `mlflow.pyfunc.load_model("models:/<name>@champion")`
predicts class logits from a float32 feature matrix anywhere torch is installed. The class
labels travel as model metadata. A new version becomes `champion` only if its validation
macro-F1 (tracking.run.SCORE_TAG) beats the current champion's; otherwise it is the
`challenger`. A model the server cannot take is saved in the run's spool as an MLflow
model (it loads from there as it is) and logged when the spool is delivered.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.models import Model, infer_signature
from mlflow.tracking import MlflowClient

from tracking.config import TrackingConfig
from tracking.run import SCORE_TAG, champion, deliver, send_or_keep
from tracking.server import TrackingUnavailable
from tracking.spool import Spool

_EXAMPLE_FILE = "example.npy"


def log_model(config: TrackingConfig, run_id: str, network: torch.nn.Module,
              example: np.ndarray, classes: list[str]) -> str:
    """Log `network` under the run; returns the model URI to register: `models:/...`, or
    the local path of the model kept in the run's spool when the server cannot take it
    (waiting up to `config.delivery_wait_s` first)."""
    network = network.eval().cpu()
    return send_or_keep(
        config, run_id, "the model",
        send=lambda _: _log_to_run(config, run_id, network, example, classes),
        keep=lambda spool: _keep_model(spool, network, example, classes),
        wait_s=config.delivery_wait_s)


def _model_arguments(network: torch.nn.Module, example: np.ndarray,
                     classes: list[str]) -> dict[str, Any]:
    """What the model is logged (or saved) with: signature, example, labels, requirements."""
    with torch.no_grad():
        output = network(torch.from_numpy(example)).numpy()
    return {"signature": infer_signature(example, output), "input_example": example,
            "metadata": {"classes": classes},
            "pip_requirements": [f"torch=={torch.__version__.split('+')[0]}"]}


def _log_to_run(config: TrackingConfig, run_id: str, network: torch.nn.Module,
                example: np.ndarray, classes: list[str]) -> str:
    mlflow.set_tracking_uri(config.tracking_uri)
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pytorch.log_model(network, name="model",
                                        **_model_arguments(network, example, classes))
    return str(info.model_uri)


def _keep_model(spool: Spool, network: torch.nn.Module, example: np.ndarray,
                classes: list[str]) -> str:
    """Save the model into the spool (through a temporary directory and a rename)."""
    target = spool.model_dir
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a crash
    mlflow.pytorch.save_model(network, str(partial),
                              **_model_arguments(network, example, classes))
    np.save(partial / _EXAMPLE_FILE, example)
    shutil.rmtree(target, ignore_errors=True)  # a retried job's model replaces the first
    partial.rename(target)
    spool.mark("model_uri", None)
    return str(target)


def log_kept_model(config: TrackingConfig, run_id: str, spool: Spool) -> str:
    """Log the model kept in `spool` to the run exactly as `log_model` would have."""
    network = mlflow.pytorch.load_model(str(spool.model_dir))
    example = np.load(spool.model_dir / _EXAMPLE_FILE)
    classes = (Model.load(str(spool.model_dir)).metadata or {})["classes"]
    return _log_to_run(config, run_id, network, example, classes)


def sent_model_uri(config: TrackingConfig, model_uri: str) -> str:
    """`model_uri`, or for a model kept in a spool, the URI it has on the server once the
    spool is delivered (delivering it now if it was not)."""
    path = Path(model_uri)
    if not (path.is_absolute() and (path.parent / "run.json").exists()):
        return model_uri
    spool = Spool(path.parent)
    if spool.progress().get("model_uri") is None:
        deliver(spool, config)
    sent = spool.progress().get("model_uri")
    if sent is None:
        raise TrackingUnavailable(f"the model at {model_uri} is not on {spool.run['tracking_uri']} "
                           f"yet; once the server is back, `{spool.upload_command()}` sends "
                           "it, then register it again")
    return str(sent)


def register_and_promote(config: TrackingConfig, model_uri: str, name: str,
                         score: float) -> dict[str, Any]:
    """Register `model_uri` as a new version of `name`; alias it champion if it wins."""
    model_uri = sent_model_uri(config, model_uri)
    client = MlflowClient(config.tracking_uri)
    mlflow.set_tracking_uri(config.tracking_uri)
    version = mlflow.register_model(model_uri, name, tags={SCORE_TAG: str(score)})
    current = champion(config.tracking_uri, name)
    previous = current["score"] if current else None
    alias = "champion" if previous is None or score > previous else "challenger"
    client.set_registered_model_alias(name, alias, version.version)
    return {"name": name, "version": int(version.version), "alias": alias,
            "score": score, "previous_champion_score": previous}
