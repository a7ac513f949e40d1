"""Logging the trained model to its run, registering it, and moving the `champion` alias.

The model is logged as a pyfunc `CodecClassifier` (tracking/pyfunc.py): the network
without Lightning plus its dataset's feature codec, with a signature naming the original
input columns and an input example of raw rows, so `mlflow.pyfunc.load_model(
"models:/<name>@champion").predict(df)` takes rows as the input files hold them. The
class labels travel as model metadata too. A new version becomes `champion` only if it
beats the class-prior baseline on held-out rows and its macro-F1 beats the current
champion's; otherwise it is the `challenger` (or, below the baseline, has no alias).
"""

from __future__ import annotations

import json
import tempfile
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pyarrow.parquet as pq
import torch
from mlflow.tracking import MlflowClient

from preprocessing.features import FeatureCodec
from preprocessing.manifest import read_manifest, shard_uri
from tracking.config import TrackingConfig
from tracking.pyfunc import (
    CODEC_ARTIFACT,
    NETWORK_ARTIFACT,
    CodecClassifier,
    mlflow_type,
    signature,
)

SCORE_TAG = "ballast.val_macro_f1"
BASELINE_TAG = "ballast.beats_class_prior"
NUM_EXAMPLE_ROWS = 5
_REQUIREMENTS = ("torch", "numpy", "pandas", "pyarrow")


def log_model(config: TrackingConfig, run_id: str, network: torch.nn.Module,
              dataset: str) -> str:
    """Log `network` with the codec and classes of `dataset` (the version it was trained
    on) under the run; returns the model URI to register."""
    manifest, _ = read_manifest(dataset)
    codec = FeatureCodec.from_manifest(manifest)
    classes = [str(label) for label in manifest.classes]
    mlflow.set_tracking_uri(config.tracking_uri)
    with tempfile.TemporaryDirectory() as work, mlflow.start_run(run_id=run_id):
        artifacts = {CODEC_ARTIFACT: f"{work}/codec.json", NETWORK_ARTIFACT: f"{work}/net.pt"}
        Path(artifacts[CODEC_ARTIFACT]).write_text(
            json.dumps({"columns": codec.to_json(), "classes": classes}, indent=1))
        torch.save(network.eval().cpu(), artifacts[NETWORK_ARTIFACT])
        info = mlflow.pyfunc.log_model(
            name="model", python_model=CodecClassifier(), artifacts=artifacts,
            signature=signature(codec), input_example=example_rows(dataset, codec),
            metadata={"classes": classes, "dataset_version": manifest.version_id},
            pip_requirements=[f"{name}=={package_version(name).split('+')[0]}"
                              for name in _REQUIREMENTS])
    return str(info.model_uri)


def example_rows(dataset: str, codec: FeatureCodec) -> pd.DataFrame:
    """The first rows of the version's first train shard, feature columns only, as the
    input files held them (an integer column declared `double` as floats)."""
    manifest, location = read_manifest(dataset)
    first = manifest.split("train").shards[0]
    table = pq.read_table(shard_uri(location, first), columns=codec.names)
    frame = table.slice(0, NUM_EXAMPLE_ROWS).to_pandas()
    for spec in codec.columns:
        if mlflow_type(spec) == "double":
            frame[spec.name] = frame[spec.name].astype("float64")
    return frame


def champion_score(client: MlflowClient, name: str) -> float | None:
    """Validation macro-F1 of the current champion, or None when there is none."""
    try:
        version = client.get_model_version_by_alias(name, "champion")
    except mlflow.exceptions.MlflowException:
        return None
    score = version.tags.get(SCORE_TAG)
    return float(score) if score is not None else None


def register_and_promote(config: TrackingConfig, model_uri: str, name: str,
                         score: float, beats_baseline: bool = True) -> dict[str, Any]:
    """Register `model_uri` as a new version of `name`; alias it champion if it wins. A
    model that does not beat the class-prior baseline gets no alias at all."""
    client = MlflowClient(config.tracking_uri)
    mlflow.set_tracking_uri(config.tracking_uri)
    version = mlflow.register_model(model_uri, name, tags={
        SCORE_TAG: str(score), BASELINE_TAG: str(beats_baseline).lower()})
    previous = champion_score(client, name)
    alias: str | None = None
    if beats_baseline:
        alias = "champion" if previous is None or score > previous else "challenger"
        client.set_registered_model_alias(name, alias, version.version)
    return {"name": name, "version": int(version.version), "alias": alias,
            "score": score, "beats_class_prior": beats_baseline,
            "previous_champion_score": previous}
