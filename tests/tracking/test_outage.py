"""A stopped `mlflow server` costs time, never data: training completes, and the run, its
params, metrics and model reach the server once it is back (at the run's close, or by
`python -m tracking upload`). Each test stops and restarts a real server process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from mlflow.tracking import MlflowClient

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import Manifest, read_manifest, shard_uri
from preprocessing.driver.reshard import run_reshard
from tests.services import free_port, start_mlflow_server, stop_server
from tracking.config import TrackingConfig
from tracking.lifecycle.registry import register_and_promote
from tracking.run.runs import finish_run, start_run
from tracking.run.spool import Spool
from training.config import LoaderConfig, TrainConfig, load_train_config
from training.launch import LocalJob, RetryPolicy, run_job
from training.launch.processes import child_env

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _no_stale_tracking_uri(monkeypatch) -> None:
    """mlflow.set_tracking_uri is process-global; each test starts without one."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def dataset(
    tiny_raw: Path, tmp_path_factory: pytest.TempPathFactory, dask_client: Any
) -> tuple[Manifest, str]:
    """The version every test here trains on (read only): one reshard for the module."""
    result = run_reshard(
        ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tiny_raw)]),
            output_root=str(tmp_path_factory.mktemp("ds")),
        ),
        dask_client,
    )
    return result.manifest, result.manifest_uri


def tracking_at(port: int, tmp_path: Path, **fields: Any) -> TrackingConfig:
    return TrackingConfig(
        tracking_uri=f"http://127.0.0.1:{port}",
        experiment="outage",
        spool_dir=str(tmp_path / "spool"),
        system_metrics_interval_s=1.0,
        **fields,
    )


def launch_once(path: Path) -> dict[str, Any]:
    """One attempt of the job on one process: a fault must not need a retry to be survived."""
    launch = LocalJob(num_processes_per_node=1, timeout_s=600, retry=RetryPolicy(attempts=1))
    return run_job(load_train_config(path), launch)


def job_config(
    tmp_path: Path, manifest_uri: str, tracking: TrackingConfig, max_epochs: int
) -> Path:
    config = TrainConfig(
        dataset=manifest_uri,
        output_dir=str(tmp_path / "job"),
        max_epochs=max_epochs,
        loader=LoaderConfig(batch_size=16),
        tracking=tracking,
    )
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return path


def wait_for_metrics(client: MlflowClient, run_id: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.get_run(run_id).data.metrics:
            return
        time.sleep(0.5)
    raise AssertionError("no metric reached the server before the outage")


def logged_values(client: MlflowClient, run_id: str) -> int:
    """Values stored for the job's own metrics (system metrics are sent by each node's
    sampler, not by the rank-0 logger whose counts the summary reports)."""
    keys = [key for key in client.get_run(run_id).data.metrics if not key.startswith("system/")]
    return sum(len(client.get_metric_history(run_id, key)) for key in keys)


def assert_complete(
    client: MlflowClient, run_id: str, summary: dict[str, Any], manifest: Manifest
) -> None:
    """FINISHED; every value the logger accepted is stored; system metrics, plots,
    checkpoints and the summary are there; the dataset input is the version."""
    run = client.get_run(run_id)
    delivery = summary["tracking_delivery"]
    assert run.info.status == "FINISHED"
    assert logged_values(client, run_id) == delivery["delivered"] + delivery["kept_locally"]
    assert {"train_loss", "val_macro_f1"} <= set(run.data.metrics)
    assert any(key.startswith("system/node_0/") for key in run.data.metrics)
    assert run.inputs.dataset_inputs[0].dataset.digest == manifest.version_id
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"plots", "checkpoints", "training", "dataset"} <= artifacts


def assert_predicts(tracking_uri: str, model_uri: str, manifest_uri: str) -> None:
    """The model loads from the server and gives a label and one probability per class for
    each raw input row."""
    mlflow.set_tracking_uri(tracking_uri)
    manifest, location = read_manifest(manifest_uri)
    shard = pq.read_table(shard_uri(location, manifest.split("holdout").shards[0]))
    served = mlflow.pyfunc.load_model(model_uri).predict(
        shard.select(manifest.feature_columns).to_pandas(), params={"details": True}
    )
    assert np.stack(served["probabilities"]).shape == (shard.num_rows, len(manifest.classes))


def test_outage_mid_run_costs_time_only(dataset, tmp_path) -> None:
    """Fault: the server is stopped while metrics flow and restarted while the job runs or
    ends. Invariants: training completes; delivery failed at least once (the outage hit);
    nothing is kept locally (the end of the job waits for the server); the closed run is
    complete and its model loads from the server."""
    manifest, manifest_uri = dataset
    port = free_port()
    server = start_mlflow_server(tmp_path, port)
    tracking = tracking_at(port, tmp_path)
    run_id = start_run(tracking, manifest, manifest_uri, {}, {})
    path = job_config(tmp_path, manifest_uri, tracking.model_copy(update={"run_id": run_id}), 10)
    summary: dict = {}
    job = threading.Thread(target=lambda: summary.update(launch_once(path)))
    job.start()
    client = MlflowClient(tracking.tracking_uri)
    wait_for_metrics(client, run_id)
    stop_server(server)
    time.sleep(3)
    server = start_mlflow_server(tmp_path, port)
    try:
        job.join(timeout=600)
        delivery = summary["tracking_delivery"]
        assert delivery["failed_attempts"] > 0 and delivery["kept_locally"] == 0
        assert summary["model_uri"].startswith("models:/")
        finish_run(tracking, run_id, summary, manifest, summary["checkpoint_uri"])
        assert_complete(client, run_id, summary, manifest)
        assert_predicts(tracking.tracking_uri, summary["model_uri"], manifest_uri)
    finally:
        stop_server(server)


def test_down_at_start_the_job_trains_and_an_upload_delivers_the_run(dataset, tmp_path) -> None:
    """Fault: no server from the run's start to its close. Invariants: training completes
    on a `local-` run; everything is kept in its spool; after the server starts,
    `python -m tracking upload <dir>` creates the run and it is complete (params,
    lineage, every metric value, system metrics, plots, checkpoints, FINISHED) with a
    model that loads from the server."""
    manifest, manifest_uri = dataset
    port = free_port()
    tracking = tracking_at(port, tmp_path, delivery_wait_s=1.0)
    with warnings.catch_warnings(record=True):
        run_id = start_run(tracking, manifest, manifest_uri, {"job": "down"}, {})
    assert run_id.startswith("local-")
    path = job_config(tmp_path, manifest_uri, tracking.model_copy(update={"run_id": run_id}), 2)
    summary = launch_once(path)
    assert summary["run_id"] == run_id and summary["tracking_delivery"]["kept_locally"] > 0
    with warnings.catch_warnings(record=True):
        finish_run(tracking, run_id, summary, manifest, summary["checkpoint_uri"])
    spool = Spool.of_run(tracking, run_id)
    server = start_mlflow_server(tmp_path, port)
    try:
        upload = subprocess.run(
            [sys.executable, "-m", "tracking", "upload", str(spool.path)],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert upload.returncode == 0, upload.stderr
        sent_id = spool.run["run_id"]
        assert sent_id in upload.stdout
        client = MlflowClient(tracking.tracking_uri)
        assert client.get_run(sent_id).data.params["job"] == "down"
        assert_complete(client, sent_id, summary, manifest)
        assert_predicts(tracking.tracking_uri, spool.progress()["model_uri"], manifest_uri)
    finally:
        stop_server(server)


def test_down_through_the_job_and_log_model_delivered_at_the_close(dataset, tmp_path) -> None:
    """Fault: the server stops after the run is created and stays down for the whole job
    (every metric, system metrics, `log_model`); it is back for the close. Invariants:
    training completes and keeps the model locally; `finish_run` sends everything, so
    the run is complete and FINISHED; the kept model registers as champion from the
    summary's model URI and loads from the registry."""
    manifest, manifest_uri = dataset
    port = free_port()
    server = start_mlflow_server(tmp_path, port)
    tracking = tracking_at(port, tmp_path, delivery_wait_s=2.0, registered_model_name="outage-clf")
    run_id = start_run(tracking, manifest, manifest_uri, {}, {})
    stop_server(server)
    path = job_config(tmp_path, manifest_uri, tracking.model_copy(update={"run_id": run_id}), 2)
    summary = launch_once(path)
    assert summary["tracking_delivery"]["kept_locally"] > 0
    assert not summary["model_uri"].startswith("models:/")
    server = start_mlflow_server(tmp_path, port)
    try:
        assert finish_run(tracking, run_id, summary, manifest, summary["checkpoint_uri"]) == run_id
        client = MlflowClient(tracking.tracking_uri)
        assert_complete(client, run_id, summary, manifest)
        registered = register_and_promote(
            tracking, summary["model_uri"], "outage-clf", summary["val_macro_f1"]
        )
        assert registered["alias"] == "champion"
        assert_predicts(tracking.tracking_uri, "models:/outage-clf@champion", manifest_uri)
    finally:
        stop_server(server)
