"""A tracked job against a real MLflow server (sqlite + artifacts on moto S3), end to end:
lineage, metrics, plots, checkpoints, registry aliases, a loadable champion, no secrets."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import mlflow
import numpy as np
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.driver.reshard import run_reshard
from tracking.config import TrackingConfig
from tracking.lifecycle.registry import register_and_promote
from tracking.run.runs import finish_run, flatten, start_run
from training.config import LoaderConfig, TrainConfig
from training.launch import LocalJob, RetryPolicy, run_job
from training.models.config import ModelConfig

SECRET = f"do-not-log-{uuid.uuid4().hex}"


def tracked_job(
    tmp_path: Path,
    name: str,
    manifest_uri: str,
    tracking: TrackingConfig,
    model: ModelConfig,
    epochs: int,
) -> tuple[str, dict]:
    """reshard output -> run -> 1-process training job -> finished run; (run id, summary)."""
    manifest, location = read_manifest(manifest_uri)
    run_id = start_run(tracking, manifest, location, {"job": name}, {"ballast.strategy": "ddp"})
    config = TrainConfig(
        dataset=location,
        output_dir=str(tmp_path / name),
        max_epochs=epochs,
        loader=LoaderConfig(batch_size=32),
        model=model,
        tracking=tracking.model_copy(update={"run_id": run_id}),
    )
    job = LocalJob(num_processes_per_node=1, timeout_s=600, retry=RetryPolicy(attempts=1))
    summary = run_job(config, job)
    finish_run(tracking, run_id, summary, manifest, summary["checkpoint_uri"])
    return run_id, summary


def all_artifact_text(client: MlflowClient, run_id: str, path: str = "") -> str:
    """The text of every JSON/YAML/text artifact of a run (recursively)."""
    text = []
    for item in client.list_artifacts(run_id, path or None):
        if item.is_dir:
            text.append(all_artifact_text(client, run_id, item.path))
        elif item.path.endswith((".json", ".yaml", ".txt", ".MLmodel", "MLmodel")):
            local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=item.path)
            text.append(Path(local).read_text())
    return "\n".join(text)


@pytest.mark.slow
def test_tracked_jobs_register_champion_then_challenger(
    tiny_raw, tmp_path, dask_client, mlflow_uri, monkeypatch
) -> None:
    """Invariants: the run holds params, tags, the dataset input (digest = version id),
    metrics (system metrics of node 0 included), plots, checkpoints and the manifest;
    the first model is `champion`; a worse
    second model becomes `challenger` and the champion does not move; the champion loads
    from `models:/<name>@champion` and predicts one class per row of a shard; a secret in
    the environment appears in no param, tag or artifact."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    result = run_reshard(
        ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tiny_raw)]), output_root=str(tmp_path / "ds")
        ),
        dask_client,
    )
    tracking = TrackingConfig(
        tracking_uri=mlflow_uri,
        experiment="lifecycle",
        registered_model_name=f"clf-{uuid.uuid4().hex[:6]}",
        system_metrics_interval_s=1.0,
    )
    good_run, good = tracked_job(
        tmp_path, "good", result.manifest_uri, tracking, ModelConfig(), epochs=3
    )
    bad_run, bad = tracked_job(
        tmp_path,
        "bad",
        result.manifest_uri,
        tracking,
        ModelConfig(hidden_sizes=[2], learning_rate=1e-6),
        epochs=1,
    )
    assert good["val_macro_f1"] > bad["val_macro_f1"]
    name = tracking.registered_model_name
    first = register_and_promote(tracking, good["model_uri"], name, good["val_macro_f1"])
    second = register_and_promote(tracking, bad["model_uri"], name, bad["val_macro_f1"])
    assert (first["alias"], second["alias"]) == ("champion", "challenger")
    client = MlflowClient(mlflow_uri)
    assert client.get_model_version_by_alias(name, "champion").version == str(first["version"])
    run = client.get_run(good_run)
    assert run.data.params["job"] == "good" and run.data.tags["ballast.strategy"] == "ddp"
    assert run.inputs.dataset_inputs[0].dataset.digest == result.manifest.version_id
    assert {"train_loss", "val_macro_f1"} <= set(run.data.metrics)
    assert any(key.startswith("system/node_0/cpu") for key in run.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(good_run, "plots")}
    assert {
        "plots/class_source_mix.png",
        "plots/shard_rows.png",
        "plots/loss_curve.png",
        "plots/confusion_matrix.png",
    } <= artifacts
    assert any(a.path.endswith(".ckpt") for a in client.list_artifacts(good_run, "checkpoints"))
    champion = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    manifest, location = read_manifest(result.manifest_uri)
    shard = pq.read_table(shard_uri(location, manifest.split("holdout").shards[0]))
    served = champion.predict(
        shard.select(manifest.feature_columns).to_pandas(), params={"details": True}
    )
    assert np.stack(served["probabilities"]).shape == (shard.num_rows, len(manifest.classes))
    for run_id in (good_run, bad_run):
        logged = client.get_run(run_id).data
        everything = json.dumps([logged.params, logged.tags]) + all_artifact_text(client, run_id)
        assert SECRET not in everything


def test_flatten_redacts_credential_like_names() -> None:
    """Invariant: a config value under a credential-like name never reaches a param."""
    flat = flatten({"storage": {"aws_secret_access_key": "x", "api_token": "y", "bucket": "b"}})
    assert flat == {
        "storage.aws_secret_access_key": "***",
        "storage.api_token": "***",
        "storage.bucket": "b",
    }


@pytest.fixture(autouse=True)
def _no_stale_tracking_uri(monkeypatch) -> None:
    """mlflow.set_tracking_uri is process-global; each test starts without one."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
