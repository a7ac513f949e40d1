"""Logging the trained model to its run, registering it, and moving the `champion` alias.

The model is logged as a pyfunc `CodecClassifier` (tracking/pyfunc.py): the network
without Lightning plus its dataset's feature codec, with a signature naming the original
input columns and an input example of raw rows, so `mlflow.pyfunc.load_model(
"models:/<name>@champion").predict(df)` takes rows as the input files hold them. The
class labels travel as model metadata too. A new version becomes `champion` only if it
beats the class-prior baseline on held-out rows and its macro-F1 (tracking.run.SCORE_TAG)
beats the current champion's; otherwise it is the `challenger` (below the baseline: no
alias). The pipeline passes a `Promotion` instead: then tracking/promotion.py decides, on
the champion's score on the same held-out rows and the drift against the parent version.
A model the server cannot take is saved in the run's spool as an MLflow model (it loads
from there as it is) and logged when the spool is delivered.
beats the class-prior baseline on held-out rows and its held-out macro-F1
(tracking.run.SCORE_TAG) beats the current champion's; otherwise it is the `challenger`
(below the baseline: no alias). A model the server cannot take is saved in the run's
spool as an MLflow model (it loads from there as it is) and logged when the spool is
delivered.

The model is logged into the job's run without making it the active run, so logging it
never ends the run (tracking/run.py opens and closes runs). Registration is idempotent:
a retry (after a reply lost on the way) finds the version its run registered and reuses
it, so one run never has two versions of a model.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

import mlflow
import mlflow.tracking.fluent as mlflow_fluent
import pandas as pd
import torch
from mlflow.entities.model_registry import ModelVersion
from mlflow.models import Model
from mlflow.tracking import MlflowClient

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.integrity import ShardRef, read_shard_table, shard_version
from preprocessing.contract.manifest import Manifest, read_manifest, shard_uri
from tracking.config import TrackingConfig
from tracking.promotion import Promotion, apply_decision
from tracking.pyfunc import (
    CODEC_ARTIFACT,
    NETWORK_ARTIFACT,
    CodecClassifier,
    mlflow_type,
    signature,
)
from tracking.run import SCORE_TAG, champion, deliver, send_or_keep
from tracking.server import TrackingUnavailable
from tracking.spool import Spool

BASELINE_TAG = "ballast.beats_class_prior"
PREVIOUS_SCORE_TAG = "ballast.previous_champion_heldout_macro_f1"
NUM_EXAMPLE_ROWS = 5
_REQUIREMENTS = ("torch", "numpy", "pandas", "pyarrow")


def log_model(config: TrackingConfig, run_id: str, network: torch.nn.Module,
              dataset: str) -> str:
    """Log `network` with the codec and classes of `dataset` (the version it was trained
    on) under the run; returns the model URI to register: `models:/...`, or the local
    path of the model kept in the run's spool when the server cannot take it (waiting up
    to `config.delivery_wait_s` first)."""
    manifest, location = read_manifest(dataset)
    codec = FeatureCodec.from_manifest(manifest)
    model = CodecClassifier(network.eval().cpu(), codec,
                            [str(label) for label in manifest.classes])
    example = example_rows(manifest, location, codec)
    extra = {"dataset_version": manifest.version_id}
    return send_or_keep(
        config, run_id, "the model",
        send=lambda _: _log_to_run(config, run_id, model, example, extra),
        keep=lambda spool: _keep_model(spool, model, example, extra),
        wait_s=config.delivery_wait_s)


def example_rows(manifest: Manifest, location: str, codec: FeatureCodec) -> pd.DataFrame:
    """The first rows of the version's first train shard, feature columns only, as the
    input files held them (an integer column declared `double` as floats). The shard is
    read through the contract's integrity reader: a damaged one is ShardDamaged naming it
    (size against the manifest's, page checksums), not pyarrow's footer error."""
    first = manifest.split("train").shards[0]
    uri = shard_uri(location, first)
    table = read_shard_table(ShardRef(uri, first, shard_version(uri)), columns=codec.names)
    frame = table.slice(0, NUM_EXAMPLE_ROWS).to_pandas()
    for spec in codec.columns:
        if mlflow_type(spec) == "double":
            frame[spec.name] = frame[spec.name].astype("float64")
    return frame


@contextmanager
def _model_arguments(model: CodecClassifier, example: pd.DataFrame,
                     extra: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """What the model is logged (or saved) with: the network and codec as artifacts,
    signature, example, labels, requirements."""
    assert model.codec is not None
    with tempfile.TemporaryDirectory() as work:
        artifacts = {CODEC_ARTIFACT: f"{work}/codec.json", NETWORK_ARTIFACT: f"{work}/net.pt"}
        Path(artifacts[CODEC_ARTIFACT]).write_text(json.dumps(
            {"columns": model.codec.to_json(), "classes": model.classes}, indent=1))
        torch.save(model.network, artifacts[NETWORK_ARTIFACT])
        yield {"python_model": CodecClassifier(), "artifacts": artifacts,
               "signature": signature(model.codec), "input_example": example,
               "metadata": {**extra, "classes": model.classes},
               "pip_requirements": [f"{name}=={package_version(name).split('+')[0]}"
                                    for name in _REQUIREMENTS]}


def _log_to_run(config: TrackingConfig, run_id: str, model: CodecClassifier,
                example: pd.DataFrame, extra: dict[str, Any]) -> str:
    # Not `with mlflow.start_run(run_id=...)`: leaving that block would end the job's run
    # (FINISHED, or FAILED on an error) before its close. The logged model goes into the
    # run's experiment, which MLflow takes from the active one.
    # The active experiment is a process global of MLflow's: restored afterwards, so a later
    # `start_run` in this process (another store, another job) does not look for this one.
    mlflow.set_tracking_uri(config.tracking_uri)
    experiment_id = MlflowClient(config.tracking_uri).get_run(run_id).info.experiment_id
    previous = mlflow_fluent._active_experiment_id
    mlflow.set_experiment(experiment_id=experiment_id)
    try:
        with _model_arguments(model, example, extra) as arguments:
            info = Model.log(None, name="model", flavor=mlflow.pyfunc, run_id=run_id,
                             **arguments)
    finally:
        mlflow_fluent._active_experiment_id = previous
    return str(info.model_uri)


def _keep_model(spool: Spool, model: CodecClassifier, example: pd.DataFrame,
                extra: dict[str, Any]) -> str:
    """Save the model into the spool (through a temporary directory and a rename)."""
    target = spool.model_dir
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a crash
    with _model_arguments(model, example, extra) as arguments:
        mlflow.pyfunc.save_model(str(partial), **arguments)
    shutil.rmtree(target, ignore_errors=True)  # a retried job's model replaces the first
    partial.rename(target)
    spool.mark("model_uri", None)
    return str(target)


def log_kept_model(config: TrackingConfig, run_id: str, spool: Spool) -> str:
    """Log the model kept in `spool` to the run exactly as `log_model` would have."""
    saved = Model.load(str(spool.model_dir))
    model = mlflow.pyfunc.load_model(str(spool.model_dir)).unwrap_python_model()
    example = saved.load_input_example(str(spool.model_dir))
    extra = {k: v for k, v in (saved.metadata or {}).items() if k != "classes"}
    return _log_to_run(config, run_id, model, example, extra)


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
                         score: float, beats_baseline: bool = True,
                         promotion: Promotion | None = None,
                         description: str = "") -> dict[str, Any]:
    """Register `model_uri` as a version of `name` (the version its run registered
    already, on a retry), with `description` (what the registry's UI shows on the version);
    alias it champion if it wins. A model that does not beat the class-prior baseline gets
    no alias at all. With `promotion` (the champion scored on the same rows, the drift),
    tracking/promotion.py decides instead of the stored scores."""
    model_uri = sent_model_uri(config, model_uri)
    client = MlflowClient(config.tracking_uri)
    run_id = source_run_id(client, model_uri)
    current = champion(config.tracking_uri, name)
    version = registered_version(client, name, run_id) or _register(
        config, model_uri, name, score, beats_baseline, current)
    if description:
        client.update_model_version(name, version.version, description=description)
    ours = current is not None and current["version"] == int(version.version)
    if promotion is not None:
        return apply_decision(client, name, version.version, score, beats_baseline,
                              _champion_before(promotion) if ours else current, promotion)
    previous = _previous_score(version) if ours else (current["score"] if current else None)
    alias: str | None = None
    if beats_baseline:
        wins = ours or previous is None or score > previous
        alias = "champion" if wins else "challenger"
        client.set_registered_model_alias(name, alias, version.version)
    return {"name": name, "version": int(version.version), "alias": alias,
            "score": score, "beats_class_prior": beats_baseline,
            "previous_champion_score": previous}


def source_run_id(client: MlflowClient, model_uri: str) -> str | None:
    """The run a logged model came from: `runs:/<run>/...`, or a `models:/m-...` logged
    model's source run; None for any other URI."""
    if model_uri.startswith("runs:/"):
        return model_uri.removeprefix("runs:/").split("/", 1)[0]
    model_id = model_uri.removeprefix("models:/")
    if model_uri.startswith("models:/m-") and "/" not in model_id:
        return client.get_logged_model(model_id).source_run_id
    return None


def registered_version(client: MlflowClient, name: str,
                       run_id: str | None) -> ModelVersion | None:
    """The version of `name` that run `run_id` registered already, if any (the oldest)."""
    if run_id is None:
        return None
    versions = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    return min(versions, key=lambda v: int(v.version), default=None)


def _register(config: TrackingConfig, model_uri: str, name: str, score: float,
              beats_baseline: bool, current: dict[str, Any] | None) -> ModelVersion:
    """A new version, tagged with its score and the champion's score it was compared with
    (what a retry reports when this version has become the champion meanwhile)."""
    mlflow.set_tracking_uri(config.tracking_uri)
    previous = current["score"] if current else None
    return mlflow.register_model(model_uri, name, tags={
        SCORE_TAG: str(score), BASELINE_TAG: str(beats_baseline).lower(),
        PREVIOUS_SCORE_TAG: "none" if previous is None else str(previous)})


def _champion_before(promotion: Promotion) -> dict[str, Any] | None:
    """On a retry that finds its own version champion already: the champion it was
    compared with (scored on the same rows before the first try), not itself."""
    same = promotion.same_rows
    return {"version": same.champion_version} if same is not None else None


def _previous_score(version: ModelVersion) -> float | None:
    text = version.tags.get(PREVIOUS_SCORE_TAG, "none")
    return None if text == "none" else float(text)
