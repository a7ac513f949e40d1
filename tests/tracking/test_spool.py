"""What a down tracking server cannot take is kept on disk, and an upload sends it once.

The "down server" is a loopback port nothing listens on (a real refused connection); the
upload goes to a real local sqlite store, so these run without an `mlflow server`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow.exceptions import MlflowException, RestException
from mlflow.tracking import MlflowClient

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from tests.services import free_port
from tracking.__main__ import main as tracking_cli
from tracking.config import TrackingConfig
from tracking.lifecycle.champion import champion
from tracking.lifecycle.registry import register_and_promote
from tracking.run.delivery import MetricDelivery
from tracking.run.model import log_model
from tracking.run.runs import (
    create_run,
    finish_run,
    how_to_open,
    run_page_url,
    start_run,
)
from tracking.run.spool import Spool
from tracking.server import is_transient


def down_config(tmp_path: Path, **fields: object) -> TrackingConfig:
    """A server URI on which nothing listens, with a password, and a spool under tmp_path."""
    return TrackingConfig(
        tracking_uri=f"http://ballast:hunter2@127.0.0.1:{free_port()}",
        experiment="spooled",
        spool_dir=str(tmp_path / "spool"),
        delivery_wait_s=0.0,
        **fields,
    )


def test_values_beyond_the_buffer_and_at_close_are_kept_on_disk_not_dropped(tmp_path) -> None:
    """Fault: the server refuses every connection and the queue overflows. Invariant:
    every value added is in the spool (none dropped), in order per key, and the report
    and warning say how many and which command sends them."""
    config = down_config(tmp_path)
    delivery = MetricDelivery(
        config, "0123abcd", writer="rank0", max_buffered=10, flush_interval_s=0.05
    )
    for step in range(25):
        delivery.add({"loss": float(step)}, step)
    with pytest.warns(RuntimeWarning, match="python -m tracking upload"):
        report = delivery.close()
    assert report["kept_locally"] == 25 and report["delivered"] == 0
    ((_, num_sent, values),) = Spool(report["spool"]).unsent_metrics()
    assert num_sent == 0 and sorted(v.step for v in values) == list(range(25))
    assert {v.value for v in values} == {float(step) for step in range(25)}


def test_a_run_started_while_the_server_is_down_is_kept_locally_without_its_password(
    tmp_path,
) -> None:
    """Fault: no server at start. Invariant: create_run returns a `local-` id at once
    (training can go on), its spool keeps the tags, and no file holds the password."""
    config = down_config(tmp_path)
    with pytest.warns(RuntimeWarning, match="kept in"):
        run_id = create_run(config, {"ballast.strategy": "ddp"})
    assert run_id.startswith("local-")
    spool = Spool.of_run(config, run_id)
    assert spool.run["tags"]["ballast.strategy"] == "ddp" and spool.run["run_id"] is None
    assert spool.run["tags"]["mlflow.user"] and spool.run["tags"]["mlflow.source.name"]
    assert all("hunter2" not in path.read_text() for path in spool.path.rglob("*.json"))


def test_transient_errors_are_told_from_requests_the_server_rejects() -> None:
    """Invariant: only a 4xx answer (other than rate limiting) is permanent, from the
    tracking server or from an S3 artifact store; an exception of ours is no outage."""
    assert not is_transient(RestException({"error_code": "RESOURCE_DOES_NOT_EXIST"}))
    assert not is_transient(RestException({"error_code": "INVALID_PARAMETER_VALUE"}))
    assert is_transient(RestException({"error_code": "REQUEST_LIMIT_EXCEEDED"}))
    assert is_transient(RestException({"error_code": "TEMPORARILY_UNAVAILABLE"}))
    assert is_transient(MlflowException("API request to http://x failed with exception"))
    assert is_transient(ConnectionRefusedError())
    assert not is_transient(ValueError("a bug, not an outage"))
    from botocore.exceptions import ClientError, EndpointConnectionError

    def s3_answer(status: int) -> ClientError:
        return ClientError(
            {"Error": {"Code": "x"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
        )

    assert is_transient(s3_answer(503)) and not is_transient(s3_answer(403))
    assert is_transient(EndpointConnectionError(endpoint_url="http://s3"))


def test_run_links_come_from_the_configured_server_or_give_the_ui_command() -> None:
    """Invariants: a server's link is built from its URI, without credentials; a local
    store gets no URL at all but the exact command that opens a UI on it."""
    assert (
        run_page_url("https://me:pw@mlflow.example.org/", "abc")
        == "https://mlflow.example.org/#/runs/abc"
    )
    assert run_page_url("sqlite:////data/mlflow.db", "abc") is None
    hint = how_to_open("sqlite:////data/mlflow.db", "abc")
    assert "-m mlflow ui --backend-store-uri sqlite:////data/mlflow.db" in hint
    assert "http" not in hint and "#/runs/abc" in hint


def tiny_network(num_features: int, num_classes: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(num_features, num_classes))


@pytest.mark.slow
def test_upload_sends_a_spooled_run_once_and_it_ends_finished(
    tiny_raw, tmp_path, dask_client, monkeypatch
) -> None:
    """Fault: the server is down for a whole job (start, metrics, model, close). Invariants:
    `python -m tracking upload <dir>` creates the run with its params, tags and lineage,
    every kept metric value, the model (which predicts as the trained network did) and
    the close (FINISHED, summary); the model registers from its local path and is the
    champion with its score; a second upload sends nothing twice."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # a store's default artifact root is relative to it
    result = run_reshard(
        ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tiny_raw)]), output_root=str(tmp_path / "ds")
        ),
        dask_client,
    )
    config = down_config(tmp_path, artifact_location=str(tmp_path / "artifacts"))
    warnings.simplefilter("ignore", RuntimeWarning)
    run_id = start_run(
        config,
        result.manifest,
        result.manifest_uri,
        {"train": {"lr": 0.1}},
        {"ballast.strategy": "ddp"},
    )
    delivery = MetricDelivery(config, run_id, writer="rank0")
    for step in range(30):
        delivery.add({"train_loss": 1.0 / (step + 1)}, step)
    delivery.close()
    network, example = tiny_network(4, 4), np.ones((2, 4), dtype=np.float32)
    kept_uri = log_model(config, run_id, network, result.manifest_uri)
    assert finish_run(config, run_id, {"val_macro_f1": 0.5}, result.manifest) == run_id
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spool = Spool.of_run(config, run_id)
    assert tracking_cli(["upload", str(spool.path), "--tracking-uri", store]) == 0
    client = MlflowClient(store)
    sent_id = spool.run["run_id"]
    run = client.get_run(sent_id)
    assert run.info.status == "FINISHED" and run.data.params["train.lr"] == "0.1"
    assert run.data.tags["ballast.strategy"] == "ddp"
    assert run.inputs.dataset_inputs[0].dataset.digest == result.manifest.version_id
    assert len(client.get_metric_history(sent_id, "train_loss")) == 30
    assert "training/summary.json" in {a.path for a in client.list_artifacts(sent_id, "training")}
    mlflow.set_tracking_uri(store)
    uploaded = mlflow.pyfunc.load_model(spool.progress()["model_uri"]).unwrap_python_model()
    assert uploaded.classes == [str(c) for c in result.manifest.classes]
    with torch.no_grad():
        assert torch.equal(
            uploaded.network(torch.from_numpy(example)), network(torch.from_numpy(example))
        )
    registered = register_and_promote(
        config.model_copy(update={"tracking_uri": store}), kept_uri, "spooled-clf", 0.5
    )
    assert registered["alias"] == "champion"
    assert champion(store, "spooled-clf") == {"version": 1, "score": 0.5, "run_id": sent_id}
    assert champion(store, "no-such-model") is None
    assert tracking_cli(["upload", str(spool.path), "--tracking-uri", store]) == 0
    assert len(client.get_metric_history(sent_id, "train_loss")) == 30
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert json.loads((spool.path / "progress.json").read_text())["closed"] is True
