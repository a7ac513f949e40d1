"""The flows: `reshard`, `train`, `evaluate`, `batch_inference` and `pipeline`.

Flows only orchestrate: every step is a task in flows/tasks.py that calls one
function of preprocessing/, training/ or tracking/. Training runs as its own
process group started by a launcher of training/launch/ (never a multi-process
Trainer in this process: docs/architecture.md M1), which also retries it.
"""

from __future__ import annotations

from typing import Any

from flows import tasks
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
from preprocessing.executor import DaskConfig
from preprocessing.manifest import read_manifest
from preprocessing.reshard import version_id_for, version_is_committed
from tracking.config import TrackingConfig
from training.config import TrainConfig
from training.launch import LaunchConfig


def _reshard(config: ReshardConfig, dask: DaskConfig) -> dict[str, Any]:
    # The cache is keyed by version id; a version deleted since it was cached is made again.
    version_id = version_id_for(config)
    committed = version_is_committed(config.output_root, version_id)
    task = tasks.reshard.with_options(refresh_cache=not committed)
    state = task(config, dask, version_id, return_state=True)
    dataset: dict[str, Any] = state.result()
    return {**dataset, "reused": dataset["reused"] or state.name == "Cached",
            "cached": state.name == "Cached"}


def _tracked_job(config: TrainConfig, job: LaunchConfig, dataset: str) -> dict[str, Any]:
    """Run the job on `dataset` (its launcher pins the version and opens the MLflow run),
    then close the run; the job's summary, with `run_id`."""
    summary: dict[str, Any] = tasks.train(config.model_copy(update={"dataset": dataset}), job)
    if config.tracking is not None:
        tasks.close_run(config.tracking, summary["run_id"], summary, summary["manifest_uri"],
                        config.checkpoint_uri)
    return summary


@ballast_flow("reshard")
def reshard_flow(params: ReshardParams) -> dict[str, Any]:
    """Reshard raw files into a balanced, committed dataset version."""
    dataset = _reshard(params.reshard, params.dask)
    publish_dataset(read_manifest(dataset["manifest_uri"])[0])
    return dataset


@ballast_flow("train")
def train_flow(params: TrainParams) -> dict[str, Any]:
    """One tracked training job on a dataset version."""
    summary = _tracked_job(params.train, params.job, params.train.dataset)
    tracking = params.train.tracking.tracking_uri if params.train.tracking else None
    publish_training({"training": summary, "run_id": summary["run_id"]}, tracking)
    return summary


@ballast_flow("evaluate")
def evaluate_flow(params: EvaluateParams) -> dict[str, Any]:
    """Per-class recall and macro-F1 of a model (and a baseline) on a held-out split."""
    models = {"model": params.model_uri}
    if params.baseline_model_uri:
        models["baseline"] = params.baseline_model_uri
    return {name: tasks.evaluate(uri, params.tracking, params.dataset, params.split)
            for name, uri in models.items()}


@ballast_flow("batch_inference")
def batch_inference_flow(params: InferenceParams) -> dict[str, Any]:
    """Predictions of a model over a dataset version (or Parquet files), as a new version."""
    inputs = list(params.inputs)
    if params.dataset:
        inputs += tasks.split_uris(params.dataset, params.split)
    if not inputs:
        raise ValueError("batch_inference needs `dataset` or `inputs`")
    return tasks.predict(inputs, params.model_uri, params.tracking, params.id_column,
                         params.feature_column, params.output_root, params.dask)


@ballast_flow("pipeline")
def pipeline(params: PipelineParams) -> dict[str, Any]:
    """Reshard, train on the new version, evaluate on held-out rows, register the model."""
    dataset = _reshard(params.reshard, params.dask)
    publish_dataset(read_manifest(dataset["manifest_uri"])[0])
    summary = _tracked_job(params.train, params.job, dataset["manifest_uri"])
    result: dict[str, Any] = {**dataset, "run_id": summary.pop("run_id"), "training": summary}
    tracking = params.train.tracking
    if tracking is not None and summary.get("model_uri"):
        result["evaluations"] = _evaluations(params, tracking, dataset["manifest_uri"],
                                             summary)
        if tracking.registered_model_name:
            result["registration"] = tasks.register(
                tracking, tracking.registered_model_name, summary["model_uri"],
                result["evaluations"]["rebalanced"]["macro_f1"])
    publish_training(result, tracking.tracking_uri if tracking else None)
    return result


def _evaluations(params: PipelineParams, tracking: TrackingConfig, manifest_uri: str,
                 summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The new model, and optionally one trained on the natural mix, on the same rows."""
    models = {"rebalanced": summary["model_uri"]}
    if params.compare_with_natural_mix:
        models["natural mix (no rebalance)"] = _natural_mix_model(params, tracking)
    return {name: tasks.evaluate(uri, tracking, manifest_uri, "holdout")
            for name, uri in models.items()}


def _natural_mix_model(params: PipelineParams, tracking: TrackingConfig) -> str:
    """Train the same model on the data as it came (same held-out rows: same seed/files)."""
    natural = params.reshard.model_copy(update={
        "output_root": f"{params.reshard.output_root.rstrip('/')}-natural",
        "mix": params.reshard.mix.model_copy(update={"class_weighting": "natural"}),
        "num_output_rows": None})
    dataset = _reshard(natural, params.dask)
    # Its own outputs, checkpoints and run: sharing them, a retry would resume the other job.
    checkpoint_dir = params.train.checkpoint_dir
    train = params.train.model_copy(update={
        "output_dir": f"{params.train.output_dir.rstrip('/')}-natural",
        "checkpoint_dir": f"{checkpoint_dir.rstrip('/')}-natural" if checkpoint_dir else None,
        "tracking": tracking.model_copy(update={"run_name": "natural-mix", "run_id": None})})
    summary = _tracked_job(train, params.job, dataset["manifest_uri"])
    return str(summary["model_uri"])
