"""Names and values as raw data has them, end to end, in one pipeline run (reshard,
training, the MLflow server, the registry, Prefect's artifacts):

- column names with spaces, units in parentheses, dots, slashes, quotes, a pipe,
  non-ASCII letters, 210 characters and names that differ only in case, and no id
  column: the registered pyfunc model predicts the raw rows;
- label and source values with parentheses, slashes, colons, dots, a percent sign, a
  newline, quotes, a leading digit, an empty source, a 300-character label and values
  that differ only in case: metrics land under the keys of the one rule
  (preprocessing/contract/names.py) and the originals stay where a person reads them,
  the run's summary and the Prefect tables.

The tests only read the run, so they share it: one pipeline run instead of one each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import _validate_metric_name

from flows.params import InferenceParams, PipelineParams
from flows.pipeline import batch_inference_flow, pipeline
from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.contract.names import mlflow_key
from preprocessing.driver.cluster import DaskConfig
from tracking.config import TrackingConfig
from tracking.lifecycle.scoring import load_classifier, predictions
from training.config import LoaderConfig, TrainConfig
from training.launch import LocalJob, RetryPolicy

pytestmark = pytest.mark.slow
LABEL, SOURCE = "Species (label)", "Site / origin"
FEATURES = [
    "Body Mass (g)",
    "flipper.length/mm",
    'bill "depth"',
    "ratio | %",
    "Île (région)",
    "Mass",
    "mass",
    "w" * 210,
]
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
    """Six classes the numeric columns separate, sources at random; nulls in
    `Body Mass (g)`."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, len(LABELS), num_rows)
    mass = pa.array(
        3_000 + 500 * label + rng.normal(0, 100, num_rows),
        pa.float64(),
        mask=rng.random(num_rows) < 0.1,
    )
    numbers = {name: 10 * label + rng.normal(0, 1, num_rows) for name in FEATURES[1:4]}
    return pa.table(
        {
            LABEL: pa.array([LABELS[k] for k in label]),
            SOURCE: pa.array(rng.choice(SOURCES, num_rows)),
            FEATURES[0]: mass,
            **numbers,
            FEATURES[4]: rng.choice(["Açores", "Bornéo"], num_rows),
            "Mass": rng.normal(size=num_rows),
            "mass": label.astype(np.float64),
            FEATURES[7]: rng.integers(0, 5, num_rows),
        }
    )


@pytest.fixture(scope="module")
def hostile_run(
    prefect_harness: None,
    mlflow_uri: str,
    dask_client: Client,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, str, Any]:
    """The pipeline on the session's Dask cluster (as the promotion tests run): a cluster
    of its own would cost its start and check nothing about names."""
    work = tmp_path_factory.mktemp("hostile")
    (work / "raw").mkdir()
    for part in range(3):
        pq.write_table(hostile_table(160, part), work / "raw" / f"part {part}.parquet")
    tracking = TrackingConfig(
        tracking_uri=mlflow_uri, experiment="hostile", registered_model_name="hostile"
    )
    params = PipelineParams(
        reshard=ReshardConfig(
            dataset=DatasetSpec(
                inputs=[str(work / "raw")],
                label_column=LABEL,
                source_column=SOURCE,
                feature_columns=FEATURES,
                nulls={FEATURES[0]: "fill_mean"},
            ),
            output_root=str(work / "datasets"),
            target_shard_rows=100,
            rows_per_row_group=32,
            holdout_fraction=0.2,
            mix=MixConfig(class_weighting="natural"),
        ),
        train=TrainConfig(
            dataset=str(work / "datasets"),
            output_dir=str(work / "job"),
            max_epochs=1,
            loader=LoaderConfig(batch_size=32),
            tracking=tracking,
        ),
        job=LocalJob(num_processes_per_node=1, retry=RetryPolicy(attempts=1)),
        dask=DaskConfig(kind="address", address=dask_client.scheduler.address),
    )
    return work, mlflow_uri, pipeline(**params.arguments())


def test_hostile_column_names_train_register_and_predict_raw_rows(hostile_run) -> None:
    """Invariants: the pipeline trains and registers a model; the run's params hold the
    null policy of `Body Mass (g)` under a valid key whose value names the column; the
    version's ids are derived; the registered pyfunc model's signature lists the original
    names and it predicts every raw row (a DataFrame read from the files, label and
    source dropped) as the in-process model does, probabilities summing to 1."""
    import mlflow

    work, tracking_uri, result = hostile_run
    registration = result.registration
    manifest, _ = read_manifest(result.manifest_uri)
    assert manifest.feature_columns == FEATURES and manifest.id_column == "__ballast_row_id"
    params = MlflowClient(tracking_uri).get_run(result.run_id).data.params
    renamed = [json.loads(value) for value in params.values() if value.startswith('{"key"')]
    assert any(
        record["key"].endswith("nulls.Body Mass (g)") and record["value"] == "fill_mean"
        for record in renamed
    )
    model_uri = f"models:/{registration.name}/{registration.version}"
    mlflow.set_tracking_uri(tracking_uri)
    model = mlflow.pyfunc.load_model(model_uri)
    assert model.metadata.get_input_schema().input_names() == FEATURES
    raw = pa.concat_tables(pq.read_table(path) for path in sorted((work / "raw").iterdir()))
    frame: pd.DataFrame = raw.drop_columns([LABEL, SOURCE]).to_pandas()
    served = model.predict(frame, params={"details": True})
    assert len(served) == raw.num_rows
    np.testing.assert_allclose(np.stack(served["probabilities"]).sum(axis=1), 1.0, rtol=1e-5)
    local = predictions(
        load_classifier(model_uri, tracking_uri),
        raw.append_column("row", pa.array(range(raw.num_rows))),
        "row",
    )
    assert served["predicted"].astype(str).tolist() == local.column("predicted").to_pylist()


def test_batch_inference_on_a_version_without_id_column_carries_the_derived_ids(
    hostile_run,
) -> None:
    """Invariant: batch inference over a version made without an id column, with no
    `id_column` given, takes the manifest's (the derived `__ballast_row_id`) and predicts
    every row of the split with that row's id, in the split's order."""
    work, tracking_uri, result = hostile_run
    registration = result.registration
    out = batch_inference_flow(
        **InferenceParams(
            model_uri=f"models:/{registration.name}/{registration.version}",
            tracking=TrackingConfig(tracking_uri=tracking_uri),
            dataset=result.manifest_uri,
            split="holdout",
            output_root=str(work / "predictions"),
        ).arguments()
    )
    manifest, location = read_manifest(out.manifest_uri)
    source, source_location = read_manifest(result.manifest_uri)
    assert manifest.id_column == source.id_column == "__ballast_row_id"
    predicted = [
        pq.read_table(shard_uri(location, entry)) for entry in manifest.split("predictions").shards
    ]
    held = [
        pq.read_table(shard_uri(source_location, s), columns=[source.id_column])
        for s in source.split("holdout").shards
    ]
    ids = pa.concat_tables(predicted).column(source.id_column).to_pylist()
    assert ids == pa.concat_tables(held).column(source.id_column).to_pylist() and ids


def _table_rows(key: str) -> list[dict[str, Any]]:
    from prefect.artifacts import Artifact

    artifact = Artifact.get(key)
    assert artifact is not None, key
    data = artifact.data
    return list(json.loads(data) if isinstance(data, str) else data)


def test_hostile_labels_and_sources_land_under_mapped_keys_with_originals_kept(
    prefect_harness: None, hostile_run, tmp_path: Path
) -> None:
    """Invariants: every metric key of the run is one MLflow takes; each class with
    validation support has its `val_recall/` metric under `mlflow_key(label)` (so `Mass`
    and `mass` apart); the run's summary keeps each original label with its recall and
    key; the Prefect class and source tables list the original labels and sources."""
    _, tracking_uri, result = hostile_run
    assert result.registration.version >= 1
    client = MlflowClient(tracking_uri)
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
