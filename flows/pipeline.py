"""The flows: `reshard`, `train`, `evaluate`, `batch_inference` and `pipeline`.

Flows only orchestrate: every step is a task in flows/tasks.py that calls one
function of preprocessing/, training/ or tracking/. Training runs as its own
process group started by `training.launch` (never a multi-process Trainer in
this process: docs/architecture.md M1), with job-level retries.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows import tasks
from flows.params import (
    EvaluateParams,
    InferenceParams,
    JobParams,
    PipelineParams,
    ReshardParams,
    TrainParams,
)
from flows.report import publish_dataset, publish_training
from preprocessing.config import ReshardConfig
from preprocessing.executor import DaskConfig
from preprocessing.manifest import read_manifest
from preprocessing.reshard import version_id_for, version_is_committed
from tracking.config import TrackingConfig
from training.config import TrainConfig


def _reshard(config: ReshardConfig, dask: DaskConfig) -> dict[str, Any]:
    # The cache is keyed by version id; a version deleted since it was cached is made again.
    version_id = version_id_for(config)
    committed = version_is_committed(config.output_root, version_id)
    task = tasks.reshard.with_options(refresh_cache=not committed)
    state = task(config, dask, version_id, return_state=True)
    dataset: dict[str, Any] = state.result()
    return {**dataset, "reused": dataset["reused"] or state.name == "Cached",
            "cached": state.name == "Cached"}


def _tracked_job(config: TrainConfig, job: JobParams, manifest_uri: str) -> dict[str, Any]:
    """Open the MLflow run, run the job (retried), close the run; the job's summary."""
    config = config.model_copy(update={"dataset": manifest_uri})
    run_id = None
    if config.tracking is not None:
        run_id = tasks.open_run(config.tracking, manifest_uri, config, job.num_processes)
        config = config.model_copy(
            update={"tracking": config.tracking.model_copy(update={"run_id": run_id})})
    launch = tasks.train.with_options(retries=job.retries, retry_delay_seconds=5)
    summary: dict[str, Any] = launch(config, job.num_processes, job.timeout_s)
    if config.tracking is not None and run_id is not None:
        tasks.close_run(config.tracking, run_id, summary, manifest_uri, config.output_dir)
    return {**summary, "run_id": run_id}


@flow(name="reshard", log_prints=True)
def reshard_flow(params: ReshardParams) -> dict[str, Any]:
    """Reshard raw files into a balanced, committed dataset version."""
    dataset = _reshard(params.reshard, params.dask)
    publish_dataset(read_manifest(dataset["manifest_uri"])[0])
    return dataset


@flow(name="train", log_prints=True)
def train_flow(params: TrainParams) -> dict[str, Any]:
    """One tracked training job on a dataset version."""
    summary = _tracked_job(params.train, params.job, params.train.dataset)
    tracking = params.train.tracking.tracking_uri if params.train.tracking else None
    publish_training({"training": summary, "run_id": summary["run_id"]}, tracking)
    return summary


@flow(name="evaluate", log_prints=True)
def evaluate_flow(params: EvaluateParams) -> dict[str, Any]:
    """Per-class recall and macro-F1 of a model (and a baseline) on a held-out split."""
    models = {"model": params.model_uri}
    if params.baseline_model_uri:
        models["baseline"] = params.baseline_model_uri
    return {name: tasks.evaluate(uri, params.tracking, params.dataset, params.split)
            for name, uri in models.items()}


@flow(name="batch_inference", log_prints=True)
def batch_inference_flow(params: InferenceParams) -> dict[str, Any]:
    """Predictions of a model over a dataset version (or Parquet files), as a new version."""
    inputs = list(params.inputs)
    if params.dataset:
        inputs += tasks.split_uris(params.dataset, params.split)
    if not inputs:
        raise ValueError("batch_inference needs `dataset` or `inputs`")
    return tasks.predict(inputs, params.model_uri, params.tracking, params.id_column,
                         params.feature_column, params.output_root, params.dask)


@flow(name="pipeline", log_prints=True)
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
    train = params.train.model_copy(update={
        "output_dir": f"{params.train.output_dir.rstrip('/')}-natural",
        "tracking": tracking.model_copy(update={"run_name": "natural-mix"})})
    summary = _tracked_job(train, params.job, dataset["manifest_uri"])
    return str(summary["model_uri"])
