"""The MLflow run of a job carries its config, tags, dataset lineage and manifest."""

from __future__ import annotations

import json
import uuid

import pytest
from mlflow.tracking import MlflowClient

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.toolbox.faults import ConfigError
from tracking.config import TrackingConfig
from tracking.run.logger import make_lightning_logger
from tracking.run.runs import finish_run, flatten, start_run


def test_flatten_gives_dotted_string_params() -> None:
    """Invariant: nested dicts become dotted keys; non-strings are JSON encoded."""
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": "x"}) == {
        "a.b": "1",
        "a.c": "[1, 2]",
        "d": "x",
    }


@pytest.mark.slow
def test_run_records_params_tags_lineage_and_manifest(
    tiny_raw, tmp_path, dask_client, mlflow_uri
) -> None:
    """Invariants (against a real mlflow server): params hold the flattened config; tags hold
    the dataset version; the dataset input's digest is the version id and its source the
    manifest URI, as MLflow's own `local` source; the manifest is an artifact; the run ends
    FINISHED with the summary."""
    result = run_reshard(
        ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tiny_raw)]), output_root=str(tmp_path / "out")
        ),
        dask_client,
    )
    config = TrackingConfig(tracking_uri=mlflow_uri, experiment="test-run")
    run_id = start_run(
        config,
        result.manifest,
        result.manifest_uri,
        {"train": {"max_epochs": 2}},
        {"ballast.strategy": "ddp"},
    )
    finish_run(config, run_id, {"val_macro_f1": 0.5})
    client = MlflowClient(mlflow_uri)
    run = client.get_run(run_id)
    assert run.data.params["train.max_epochs"] == "2"
    assert run.data.tags["ballast.dataset_version"] == result.manifest.version_id
    assert run.data.tags["ballast.strategy"] == "ddp"
    (dataset_input,) = run.inputs.dataset_inputs
    assert dataset_input.dataset.digest == result.manifest.version_id
    assert json.loads(dataset_input.dataset.source)["uri"] == result.manifest_uri
    assert dataset_input.dataset.source_type == "local"  # a source MLflow itself reads
    artifacts = {a.path for a in client.list_artifacts(run_id, "dataset")}
    assert artifacts == {"dataset/_MANIFEST.json"}
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_a_job_shorter_than_one_sampling_interval_still_records_its_node(
    mlflow_uri, monkeypatch
) -> None:
    """Invariant: system metrics of node 0 reach the run even when the job ends before the
    first sampling interval does (MLflow's monitor alone would log nothing), and a
    process that is not its node's first logs none."""
    from tracking.run.system_metrics import node_system_metrics

    config = TrackingConfig(
        tracking_uri=mlflow_uri, experiment="test-system-metrics", system_metrics_interval_s=60.0
    )
    client = MlflowClient(mlflow_uri)  # no fluent API: its global state would leak
    run_id = client.create_run(client.create_experiment(f"system-{uuid.uuid4().hex}")).info.run_id
    monkeypatch.setenv("LOCAL_RANK", "1")
    with node_system_metrics(config, run_id):
        pass
    assert not MlflowClient(mlflow_uri).get_run(run_id).data.metrics
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("GROUP_RANK", "3")
    with node_system_metrics(config, run_id):
        pass
    metrics = MlflowClient(mlflow_uri).get_run(run_id).data.metrics
    assert any(key.startswith("system/node_3/cpu") for key in metrics), sorted(metrics)


def test_a_rank_never_creates_a_run() -> None:
    """Invariant: the Lightning logger of a rank refuses a tracking config without a run
    id, naming the field and the launcher that creates runs (tracking/run/runs.py is the one
    place runs are opened), rather than opening a run of its own."""
    with pytest.raises(ConfigError, match=r"tracking\.run_id: .*training\.launch launch"):
        make_lightning_logger(TrackingConfig(tracking_uri="sqlite:///never-created.db"))
