"""The `pipeline` flow end to end under Prefect's test harness, on tiny generated data."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from flows.params import JobParams, PipelineParams
from flows.pipeline import pipeline
from flows.summary import format_summary
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.manifest import read_manifest
from tracking.config import TrackingConfig
from training.config import LoaderConfig, TrainConfig


def test_pipeline_reshards_trains_on_two_ranks_and_tracks(prefect_harness, tiny_raw,
                                                         tmp_path) -> None:
    """Invariants: the committed version is balanced (+-1 row per shard) and named by the
    result; both ranks ran the same positive number of batches; MLflow holds the run with
    its dataset version tag and its training and validation metrics."""
    tracking_uri = f"sqlite:///{tmp_path}/mlflow.db"
    params = PipelineParams(
        reshard=ReshardConfig(dataset=DatasetSpec(inputs=[str(tiny_raw)]),
                              output_root=str(tmp_path / "datasets"), target_shard_rows=600),
        train=TrainConfig(dataset=str(tmp_path / "datasets"), output_dir=str(tmp_path / "job"),
                          max_epochs=2, loader=LoaderConfig(batch_size=32),
                          tracking=TrackingConfig(tracking_uri=tracking_uri, experiment="e2e")),
        job=JobParams(num_processes=2, retries=0),
    )
    result = pipeline(params)
    manifest, _ = read_manifest(result["manifest_uri"])
    rows = [shard.num_rows for shard in manifest.split("train").shards]
    assert len(rows) > 1 and max(rows) - min(rows) <= 1
    batches = result["training"]["batches_per_rank"]
    assert len(batches) == 2 and batches[0] == batches[1] > 0
    run = MlflowClient(tracking_uri).get_run(result["run_id"])
    assert run.data.tags["ballast.dataset_version"] == manifest.version_id
    assert {"val_macro_f1", "train_loss"} <= set(run.data.metrics)
    assert 0.0 <= run.data.metrics["val_macro_f1"] <= 1.0
    summary = format_summary(manifest, result, tracking_uri)
    assert result["run_id"] in summary and "mlflow ui --backend-store-uri" in summary
