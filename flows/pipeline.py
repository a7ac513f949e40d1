"""The `pipeline` flow: reshard -> open the MLflow run -> train (torchrun job) -> close the run.

Tasks are thin: each calls one function of preprocessing/, training/ or
tracking/ and passes URIs and small dicts, never data. Training runs as its own
process group started by `training.launch` (never a multi-process Trainer in
this process: FINDINGS.md 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prefect import flow, task

from flows.cluster import DaskConfig, dask_client
from flows.params import PipelineParams
from preprocessing.config import ReshardConfig
from preprocessing.manifest import read_manifest
from preprocessing.reshard import run_reshard
from tracking.config import TrackingConfig
from tracking.registry import register_and_promote
from tracking.run import finish_run, start_run
from training.config import TrainConfig
from training.launch import launch_local


@task
def reshard(config: ReshardConfig, dask: DaskConfig) -> dict[str, Any]:
    """Make or find the dataset version; returns its manifest URI and whether it was reused."""
    with dask_client(dask) as client:
        result = run_reshard(config, client)
    return {"manifest_uri": result.manifest_uri, "version_id": result.manifest.version_id,
            "reused": result.reused}


@task
def open_run(tracking: TrackingConfig, manifest_uri: str, train: TrainConfig,
             num_processes: int) -> str:
    """Create the MLflow run (and its backend schema) before any rank starts."""
    manifest, location = read_manifest(manifest_uri)
    params = {"train": train.model_dump(mode="json", exclude={"tracking"}),
              "dataset": manifest.config, "num_processes": num_processes}
    tags = {"ballast.strategy": train.strategy, "ballast.world_size": str(num_processes)}
    return start_run(tracking, manifest, location, params, tags)


@task
def train(config: TrainConfig, num_processes: int, timeout_s: int) -> dict[str, Any]:
    """Write the job's config next to its outputs and run it under torchrun."""
    config_path = Path(config.output_dir) / "train-config.yaml"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return launch_local(config_path, nproc_per_node=num_processes, timeout_s=timeout_s)


@task
def close_run(tracking: TrackingConfig, run_id: str, summary: dict[str, Any],
              manifest_uri: str, output_dir: str) -> None:
    """Attach the summary, plots and checkpoints to the run and mark it finished."""
    manifest, _ = read_manifest(manifest_uri)
    finish_run(tracking, run_id, summary, manifest, f"{output_dir.rstrip('/')}/checkpoints")


@task
def register(tracking: TrackingConfig, name: str, summary: dict[str, Any]) -> dict[str, Any]:
    """Register the job's model; it becomes champion only if it beats the current one."""
    return register_and_promote(tracking, summary["model_uri"], name,
                                float(summary["val_macro_f1"]))


@flow(name="pipeline", log_prints=True)
def pipeline(params: PipelineParams) -> dict[str, Any]:
    """Reshard the raw data, then train on the version it made, tracked in MLflow."""
    dataset = reshard(params.reshard, params.dask)
    job = params.train.model_copy(update={"dataset": dataset["manifest_uri"]})
    run_id = None
    if job.tracking is not None:
        run_id = open_run(job.tracking, dataset["manifest_uri"], job, params.num_processes)
        tracking = job.tracking.model_copy(update={"run_id": run_id})
        job = job.model_copy(update={"tracking": tracking})
    summary = train(job, params.num_processes, params.train_timeout_s)
    registration = None
    if job.tracking is not None and run_id is not None:
        close_run(job.tracking, run_id, summary, dataset["manifest_uri"], job.output_dir)
        name = job.tracking.registered_model_name
        if name and summary.get("model_uri"):
            registration = register(job.tracking, name, summary)
    return {**dataset, "run_id": run_id, "training": summary, "registration": registration}
