"""The flows: `reshard`, `train`, `evaluate`, `batch_inference` and `pipeline`.

Flows only orchestrate: every step is a task in flows/tasks.py that calls one
function of preprocessing/, training/ or tracking/. Training runs as its own
process group started by a launcher of training/launch/ (never a multi-process
Trainer in this process: docs/architecture.md M1), which also retries it. Prefect never
retries a flow (no flow sets `retries`) and retries an I/O task only on a transient
failure (flows/tasks.py `TRANSIENT_RETRIES`): a config or data error fails once. What each
step produced is logged to the flow run's log (flows/runlog.py) as it comes back.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger

from flows import runlog, tasks
from flows.arms import NATURAL_MIX, arm_for
from flows.params import (
    EvaluateParams,
    InferenceParams,
    PipelineParams,
    ReshardParams,
    TrainParams,
    ballast_flow,
)
from flows.report import publish_dataset, publish_training
from preprocessing.config import ReshardConfig
from preprocessing.contract.manifest import Manifest, read_manifest
from preprocessing.driver.cluster import DaskConfig
from preprocessing.driver.reshard import version_id_for, version_is_committed
from tracking.config import TrackingConfig
from training.config import TrainConfig
from training.launch import AnyJob


def _reshard(config: ReshardConfig, dask: DaskConfig,
             arm: str) -> tuple[dict[str, Any], Manifest]:
    """The version of `config` (made, reused or a cache hit), logged; and its manifest."""
    # The cache is keyed by version id; a version deleted since it was cached is made again.
    version_id = version_id_for(config)
    runlog.log_reshard_start(arm, version_id, config.dataset.inputs,
                             config.mix.class_weighting)
    committed = version_is_committed(config.output_root, version_id)
    task = tasks.reshard.with_options(refresh_cache=not committed)
    state = task(config, dask, version_id, arm, return_state=True)
    dataset: dict[str, Any] = state.result()
    cached = state.name == "Cached"
    dataset = {**dataset, "reused": dataset["reused"] or cached, "cached": cached}
    manifest, _ = read_manifest(dataset["manifest_uri"])
    runlog.log_dataset(arm, manifest, dataset["reused"], cached)
    return dataset, manifest


def _tracked_job(config: TrainConfig, job: AnyJob, dataset: str,
                 arm: str) -> dict[str, Any]:
    """Run the job on `dataset` (its launcher pins the version and opens the MLflow run),
    then close the run; the job's summary, with `run_id`."""
    summary: dict[str, Any] = tasks.train(config.model_copy(update={"dataset": dataset}), job,
                                          arm)
    runlog.log_training(arm, summary)
    if config.tracking is not None:
        tasks.close_run(config.tracking, summary["run_id"], summary, summary["manifest_uri"],
                        config.checkpoint_uri, arm)
    return summary


@ballast_flow("reshard")
def reshard_flow(params: ReshardParams) -> dict[str, Any]:
    """Reshard raw files into a balanced, committed dataset version."""
    arm = arm_for(params.reshard.mix.class_weighting)
    dataset, manifest = _reshard(params.reshard, params.dask, arm)
    publish_dataset(manifest)
    return dataset


@ballast_flow("train")
def train_flow(params: TrainParams) -> dict[str, Any]:
    """One tracked training job on a dataset version."""
    manifest, _ = read_manifest(params.train.dataset)
    arm = arm_for(manifest.config["mix"]["class_weighting"])
    summary = _tracked_job(params.train, params.job, params.train.dataset, arm)
    tracking = params.train.tracking.tracking_uri if params.train.tracking else None
    publish_training({"training": summary, "run_id": summary["run_id"]}, tracking)
    return summary


@ballast_flow("evaluate")
def evaluate_flow(params: EvaluateParams) -> dict[str, Any]:
    """Per-class recall and macro-F1 of a model (and a baseline model) on a held-out
    split, each with the class-prior baseline and whether it beats it."""
    models = {"model": params.model_uri}
    if params.baseline_model_uri:
        models["baseline"] = params.baseline_model_uri
    evaluations = {name: tasks.evaluate(uri, params.tracking, params.dataset, params.split,
                                        params.dask, name) for name, uri in models.items()}
    for name, evaluation in evaluations.items():
        runlog.log_evaluation(name, evaluation)
    return evaluations


@ballast_flow("batch_inference")
def batch_inference_flow(params: InferenceParams) -> dict[str, Any]:
    """Predictions of a model over a dataset version (or Parquet files), as a new version."""
    inputs = list(params.inputs)
    if params.dataset:
        inputs += tasks.split_uris(params.dataset, params.split)
    if not inputs:
        raise ValueError("batch_inference needs `dataset` or `inputs`")
    output: dict[str, Any] = tasks.predict(
        inputs, params.model_uri, params.tracking, params.id_column, params.output_root,
        params.dask)
    runlog.log_predictions(output)
    return output


@ballast_flow("pipeline")
def pipeline(params: PipelineParams) -> dict[str, Any]:
    """Reshard, train on the new version, evaluate on held-out rows, register the model."""
    arm = arm_for(params.reshard.mix.class_weighting)
    dataset, manifest = _reshard(params.reshard, params.dask, arm)
    publish_dataset(manifest)
    summary = _tracked_job(params.train, params.job, dataset["manifest_uri"], arm)
    result: dict[str, Any] = {**dataset, "run_id": summary.pop("run_id"), "training": summary}
    tracking = params.train.tracking
    if tracking is not None and summary.get("model_uri"):
        result["evaluations"] = _evaluations(params, tracking, dataset["manifest_uri"],
                                             summary["model_uri"], arm)
        if tracking.registered_model_name:
            result["registration"] = _register(tracking, summary["model_uri"],
                                               result["evaluations"][arm], arm)
    publish_training(result, tracking.tracking_uri if tracking else None)
    return result


def _evaluations(params: PipelineParams, tracking: TrackingConfig, manifest_uri: str,
                 model_uri: str, arm: str) -> dict[str, dict[str, Any]]:
    """The new model, and optionally one trained on the natural mix, on the same rows."""
    models = {arm: model_uri}
    if params.compare_with_natural_mix and arm == NATURAL_MIX:
        get_run_logger().warning("compare_with_natural_mix: this run already trains on the "
                                 "natural class mix; there is no other arm to compare with")
    elif params.compare_with_natural_mix:
        models[NATURAL_MIX] = _natural_mix_model(params, tracking)
    evaluations = {name: tasks.evaluate(uri, tracking, manifest_uri, "holdout", params.dask,
                                        name) for name, uri in models.items()}
    for name, evaluation in evaluations.items():
        runlog.log_evaluation(name, evaluation)
    return evaluations


def _register(tracking: TrackingConfig, model_uri: str, evaluation: dict[str, Any],
              arm: str) -> dict[str, Any]:
    """Register the model by its held-out macro-F1 (champion only if it beats the
    class-prior baseline and the current champion), logged."""
    name = str(tracking.registered_model_name)
    registration: dict[str, Any] = tasks.register(
        tracking, name, model_uri, evaluation["macro_f1"], evaluation["beats_class_prior"], arm)
    runlog.log_registration(arm, registration)
    return registration


def _natural_mix_model(params: PipelineParams, tracking: TrackingConfig) -> str:
    """Train the same model on the data as it came (same held-out rows: same seed/files)."""
    natural = params.reshard.model_copy(update={
        "output_root": f"{params.reshard.output_root.rstrip('/')}-natural",
        "mix": params.reshard.mix.model_copy(update={"class_weighting": "natural"}),
        "num_output_rows": None})
    dataset, _ = _reshard(natural, params.dask, NATURAL_MIX)
    # Its own outputs, checkpoints and run: sharing them, a retry would resume the other job.
    checkpoint_dir = params.train.checkpoint_dir
    train = params.train.model_copy(update={
        "output_dir": f"{params.train.output_dir.rstrip('/')}-natural",
        "checkpoint_dir": f"{checkpoint_dir.rstrip('/')}-natural" if checkpoint_dir else None,
        "tracking": tracking.model_copy(update={"run_name": NATURAL_MIX, "run_id": None})})
    summary = _tracked_job(train, params.job, dataset["manifest_uri"], NATURAL_MIX)
    return str(summary["model_uri"])
