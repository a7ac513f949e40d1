"""Creating and finishing the MLflow run of a training job, with its dataset lineage.

The launcher calls `prepare_backend` and `start_run` before any rank starts (a
fresh sqlite store raced by several ranks fails: docs/architecture.md M6), passes the run
id to the ranks, and calls `finish_run` with the job's summary afterwards.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.tracking import MlflowClient

from preprocessing.manifest import Manifest
from tracking.config import TrackingConfig

_MAX_PARAM_CHARS = 6000
_SECRET_NAME = re.compile(r"secret|password|passwd|token|credential|access_key|api_key",
                          re.IGNORECASE)


def prepare_backend(config: TrackingConfig) -> str:
    """Create the store's schema and the experiment once; returns the experiment id."""
    client = MlflowClient(config.tracking_uri)
    experiment = client.get_experiment_by_name(config.experiment)
    if experiment is not None:
        return str(experiment.experiment_id)
    return str(client.create_experiment(config.experiment, config.artifact_location))


def create_run(config: TrackingConfig, tags: dict[str, str] | None = None) -> str:
    """Create a run in the config's experiment (and the store's schema first); its id."""
    experiment_id = prepare_backend(config)
    run = MlflowClient(config.tracking_uri).create_run(
        experiment_id, run_name=config.run_name, tags=tags)
    return str(run.info.run_id)


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config as dotted MLflow params (`loader.batch_size`), values as strings;
    anything whose name looks like a credential is redacted."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif _SECRET_NAME.search(name):
            flat[name] = "***"
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[name] = text[:_MAX_PARAM_CHARS]
    return flat


def git_sha() -> str:
    """The commit the code runs from, or `unknown` outside a git checkout."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True)
        return result.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def dataset_input(manifest: Manifest, manifest_uri: str) -> DatasetInput:
    """The version as an MLflow dataset input: source = manifest URI, digest = version id,
    its parent (a chain's child) as a tag and in the profile."""
    profile = {name: split.num_rows for name, split in manifest.splits.items()}
    lineage = [InputTag("ballast.parent_version", manifest.parent_version or "none")]
    dataset = Dataset(
        name=f"ballast-{manifest.version_id}", digest=manifest.version_id,
        source_type="ballast-manifest", source=json.dumps({"uri": manifest_uri}),
        schema=json.dumps({"fields": manifest.arrow_schema}),
        profile=json.dumps({"num_rows": profile, "num_classes": len(manifest.classes),
                            "parent_version": manifest.parent_version,
                            "chain_length": len(manifest.deltas)}),
    )
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training"), *lineage])


def start_run(config: TrackingConfig, manifest: Manifest, manifest_uri: str,
              params: dict[str, Any], tags: dict[str, str]) -> str:
    """Create the job's run with params, tags, dataset lineage and the manifest artifact;
    returns the run id."""
    all_tags = {"ballast.dataset_version": manifest.version_id, "git_sha": git_sha(),
                "ballast.dataset_parent_version": manifest.parent_version or "none", **tags}
    run_id = create_run(config, all_tags)
    client = MlflowClient(config.tracking_uri)
    for name, value in flatten(params).items():
        client.log_param(run_id, name, value)
    client.log_inputs(run_id, datasets=[dataset_input(manifest, manifest_uri)])
    client.log_text(run_id, manifest.to_json(), "dataset/_MANIFEST.json")
    return str(run_id)


def finish_run(config: TrackingConfig, run_id: str, summary: dict[str, Any],
               manifest: Manifest | None = None, checkpoint_dir: str | None = None) -> None:
    """Record the job's summary, plots and checkpoints, and close the run."""
    from tracking.artifacts import log_checkpoints, log_plots

    client = MlflowClient(config.tracking_uri)
    client.log_dict(run_id, summary, "training/summary.json")
    if manifest is not None:
        log_plots(client, run_id, manifest, summary)
    if checkpoint_dir is not None:
        log_checkpoints(client, run_id, checkpoint_dir)
    client.set_terminated(run_id, status="FINISHED")
