"""Label and source values as raw data has them, end to end: parentheses, slashes,
colons, dots, a percent sign, a newline, quotes, a leading digit, an empty source, a
300-character label and values that differ only in case go through the pipeline
(reshard, training, the MLflow server, Prefect's artifacts). Metrics land under the keys
of the one rule (preprocessing/contract/names.py) and the originals stay where a person
reads them: the run's summary and the Prefect tables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import _validate_metric_name

from flows.params import PipelineParams
from flows.pipeline import pipeline
from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
from preprocessing.contract.names import mlflow_key
from preprocessing.driver.cluster import DaskConfig
from tracking.config import TrackingConfig
from training.config import LoaderConfig, TrainConfig
from training.launch import LocalJob, RetryPolicy

pytestmark = pytest.mark.slow
LABELS = [
    "Adelie Penguin (Pygoscelis adeliae)",
    "a/b: 50%.\nsecond line",
    "Mass",
    "mass",
    '3rd "quoted" kind',
    "x" * 300,
]
SOURCES = ["site/1 (north)", "SITE/1 (NORTH)", "", "..:%"]


def hostile_table(num_rows: int, seed: int) -> pa.Table:
    """Classes that one numeric column separates, sources at random."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, len(LABELS), num_rows)
    return pa.table(
        {
            "label": pa.array([LABELS[k] for k in label]),
            "source": pa.array(rng.choice(SOURCES, num_rows)),
            "x": 3.0 * label + rng.normal(0, 0.3, num_rows),
            "y": rng.normal(size=num_rows),
        }
    )


def _table_rows(key: str) -> list[dict[str, Any]]:
    from prefect.artifacts import Artifact

    artifact = Artifact.get(key)
    assert artifact is not None, key
    data = artifact.data
    return list(json.loads(data) if isinstance(data, str) else data)


def test_hostile_labels_and_sources_land_under_mapped_keys_with_originals_kept(
    prefect_harness: None, mlflow_uri: str, dask_client: Client, tmp_path: Path
) -> None:
    """Invariants: the pipeline trains and registers; every metric key of the run is one
    MLflow takes; each class with validation support has its `val_recall/` metric under
    `mlflow_key(label)` (so `Mass` and `mass` apart); the run's summary keeps each
    original label with its recall and key; the Prefect class and source tables list the
    original labels and sources."""
    (tmp_path / "raw").mkdir()
    for part in range(2):
        pq.write_table(hostile_table(240, part), tmp_path / "raw" / f"part {part}.parquet")
    tracking = TrackingConfig(
        tracking_uri=mlflow_uri, experiment="hostile-values", registered_model_name="hostile-values"
    )
    params = PipelineParams(
        reshard=ReshardConfig(
            dataset=DatasetSpec(
                inputs=[str(tmp_path / "raw")],
                label_column="label",
                source_column="source",
                feature_columns=["x", "y"],
            ),
            output_root=str(tmp_path / "datasets"),
            target_shard_rows=200,
            rows_per_row_group=64,
            holdout_fraction=0.2,
            mix=MixConfig(class_weighting="natural"),
        ),
        train=TrainConfig(
            dataset=str(tmp_path / "datasets"),
            output_dir=str(tmp_path / "job"),
            max_epochs=1,
            loader=LoaderConfig(batch_size=64),
            tracking=tracking,
        ),
        job=LocalJob(num_processes_per_node=1, retry=RetryPolicy(attempts=1)),
        dask=DaskConfig(kind="address", address=dask_client.scheduler.address),
    )
    result = pipeline(**params.arguments())
    assert result.registration.version >= 1
    client = MlflowClient(mlflow_uri)
    metrics = client.get_run(result.run_id).data.metrics
    for key in metrics:
        _validate_metric_name(key)
    summary = json.loads(
        Path(
            client.download_artifacts(result.run_id, "training/summary.json", str(tmp_path))
        ).read_text()
    )
    supported = [label for label, value in summary["val_recall"].items() if value is not None]
    assert set(summary["val_recall"]) == set(LABELS) and supported
    assert {key for key in metrics if key.startswith("val_recall/")} == {
        mlflow_key(label, "val_recall/") for label in supported
    }
    for label in supported:
        assert metrics[mlflow_key(label, "val_recall/")] == pytest.approx(
            summary["val_recall"][label]
        )
    assert summary["val_recall_keys"]["Mass"] == mlflow_key("Mass", "val_recall/")
    assert "mass" not in summary["val_recall_keys"]  # a plain label is its own key
    arm = next(iter(result.runs))
    assert {row["class"] for row in _table_rows(f"{arm}-class-mix")} == set(LABELS)
    assert {row["source"] for row in _table_rows(f"{arm}-source-mix")} <= set(SOURCES)
