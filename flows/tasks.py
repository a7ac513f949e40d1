"""Prefect tasks: each calls one function of preprocessing/, training/ or tracking/ and
passes URIs and small dicts, never data. Names are those of the functions they wrap."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any, cast
from uuid import UUID

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from preprocessing.config import ReshardConfig
from preprocessing.executor import DaskConfig, dask_client
from preprocessing.manifest import read_manifest, shard_uri
from preprocessing.mapping import OutputSpec, map_to_version
from preprocessing.reshard import run_reshard
from preprocessing.secrets import redact
from tracking.config import TrackingConfig
from tracking.inference import evaluate_model, predict_table
from tracking.registry import register_and_promote
from tracking.run import finish_run
from training.config import TrainConfig
from training.launch import LaunchConfig, run_job


def _version_key(_: Any, parameters: dict[str, Any]) -> str:
    """Cache key of a reshard: its dataset version id (inputs + config + code version)."""
    return f"reshard-{parameters['version_id']}"


@task(cache_key_fn=_version_key, persist_result=True, cache_expiration=timedelta(days=30))
def reshard(config: ReshardConfig, dask: DaskConfig, version_id: str) -> dict[str, Any]:
    """Make the dataset version (a cache hit on its version id skips it entirely).
    `version_id` is `version_id_for(config)`, computed once by the caller: listing a
    large input is not free."""
    progress_id = create_progress_artifact(0.0, description="reshard: scan, exchange, write")
    stages = {"scan": 0, "exchange": 1, "write": 2}

    reporting = [True]

    def report(stage: str, done: int, total: int) -> None:
        # Progress is for people: an API server gone mid-run must not stop the reshard
        # (its commit is what a rerun reuses), so the first failed update ends reporting.
        try:
            if reporting[0]:
                update_progress_artifact(cast(UUID, progress_id),
                                         100 * (stages[stage] + done / total) / 3)
        except Exception as error:
            reporting[0] = False
            print(redact(f"reshard progress no longer reported (the Prefect API failed: "
                         f"{error})"))

    with dask_client(dask) as client:
        result = run_reshard(config, client, progress=report)
    return {"manifest_uri": result.manifest_uri, "version_id": result.manifest.version_id,
            "reused": result.reused}


@task(cache_policy=NO_CACHE)
def train(config: TrainConfig, job: LaunchConfig) -> dict[str, Any]:
    """Run the training job through its launcher, which pins the dataset version and the
    MLflow run and retries under `job.retry`, each retry resuming. The task itself is
    never retried, so retries do not multiply."""
    return run_job(config, job)


@task(cache_policy=NO_CACHE)
def close_run(tracking: TrackingConfig, run_id: str, summary: dict[str, Any],
              manifest_uri: str, checkpoint_uri: str) -> None:
    """Attach the summary, plots and checkpoints to the run and mark it finished."""
    manifest, _ = read_manifest(manifest_uri)
    finish_run(tracking, run_id, summary, manifest, checkpoint_uri)


@task(cache_policy=NO_CACHE)
def register(tracking: TrackingConfig, name: str, model_uri: str,
             score: float) -> dict[str, Any]:
    """Register a model version; it becomes champion only if it beats the current one."""
    return register_and_promote(tracking, model_uri, name, score)


@task(cache_policy=NO_CACHE)
def evaluate(model_uri: str, tracking: TrackingConfig, dataset: str,
             split: str) -> dict[str, Any]:
    """Macro-F1 and per-class recall of one model on a held-out split."""
    return evaluate_model(model_uri, tracking.tracking_uri, dataset, split)


@task(cache_policy=NO_CACHE)
def predict(inputs: list[str], model_uri: str, tracking: TrackingConfig, id_column: str,
            feature_column: str, output_root: str, dask: DaskConfig) -> dict[str, Any]:
    """Map the model over the inputs on Dask; commit the predictions as a version."""
    transform = partial(predict_table, model_uri=model_uri, tracking_uri=tracking.tracking_uri,
                        id_column=id_column, feature_column=feature_column)
    spec = OutputSpec(id_column=id_column, label_column="predicted",
                      feature_columns=["probabilities"], classes=[],
                      config={"model_uri": model_uri, "inputs": inputs})
    with dask_client(dask) as client:
        manifest, location = map_to_version(inputs, transform, output_root, spec, client)
    return {"manifest_uri": location, "version_id": manifest.version_id,
            "num_rows": manifest.split("predictions").num_rows}


def split_uris(dataset: str, split: str) -> list[str]:
    """The shard URIs of a split of a version, read through its manifest."""
    manifest, location = read_manifest(dataset)
    return [shard_uri(location, entry) for entry in manifest.split(split).shards]
