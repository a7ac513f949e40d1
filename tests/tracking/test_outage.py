"""Training survives a tracking server outage; buffered metrics arrive when it is back."""

from __future__ import annotations

import threading
import time

from mlflow.tracking import MlflowClient

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.reshard import run_reshard
from tests.services import free_port, start_mlflow_server, stop_server
from tracking.config import TrackingConfig
from tracking.run import start_run
from training.config import LoaderConfig, TrainConfig
from training.launch import LaunchConfig, RetryPolicy, run_job


def wait_for_metrics(client: MlflowClient, run_id: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.get_run(run_id).data.metrics:
            return
        time.sleep(0.5)
    raise AssertionError("no metric reached the server before the outage")


def logged_values(client: MlflowClient, run_id: str) -> int:
    """Values stored for the job's own metrics (system metrics go through MLflow's monitor,
    not through the buffered logger whose deliveries the summary counts)."""
    keys = [key for key in client.get_run(run_id).data.metrics if not key.startswith("system/")]
    return sum(len(client.get_metric_history(run_id, key)) for key in keys)


def test_training_completes_through_an_outage_and_metrics_arrive_after(tiny_raw, tmp_path,
                                                                       dask_client) -> None:
    """Invariants: with the server stopped mid-run, training still completes; delivery
    failed at least once (the outage happened while metrics were flowing); after the
    server returns, every metric value the logger accepted is stored: delivered equals
    what MLflow holds, and nothing is reported undelivered or dropped; the node's system
    metrics are there too (their last sample is taken after the server is back)."""
    result = run_reshard(ReshardConfig(dataset=DatasetSpec(inputs=[str(tiny_raw)]),
                                       output_root=str(tmp_path / "ds")), dask_client)
    port = free_port()
    server = start_mlflow_server(tmp_path, port)
    tracking = TrackingConfig(tracking_uri=f"http://127.0.0.1:{port}", experiment="outage")
    run_id = start_run(tracking, result.manifest, result.manifest_uri, {}, {})
    config = TrainConfig(dataset=result.manifest_uri, output_dir=str(tmp_path / "job"),
                         max_epochs=10, loader=LoaderConfig(batch_size=16),
                         tracking=tracking.model_copy(update={"run_id": run_id}))
    launch = LaunchConfig(num_processes_per_node=1, timeout_s=600, retry=RetryPolicy(attempts=1))
    summary: dict = {}
    job = threading.Thread(target=lambda: summary.update(run_job(config, launch)))
    job.start()
    client = MlflowClient(tracking.tracking_uri)
    wait_for_metrics(client, run_id)
    stop_server(server)
    time.sleep(3)
    server = start_mlflow_server(tmp_path, port)
    try:
        job.join(timeout=600)
        delivery = summary["tracking_delivery"]
        assert delivery["failed_attempts"] > 0
        assert delivery["undelivered"] == 0 and not delivery["dropped_by_metric"]
        assert logged_values(client, run_id) == delivery["delivered"] > 0
        assert any(key.startswith("system/node_0/") for key in client.get_run(run_id).data.metrics)
    finally:
        stop_server(server)
