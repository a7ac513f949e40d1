"""Column names as raw data has them, end to end: a table whose label and feature columns
are named with spaces, units in parentheses, dots, slashes, quotes, a pipe, non-ASCII
letters, 210 characters and names that differ only in case, and no id column, goes
through the pipeline (reshard, training, the MLflow server, the registry) and the
registered pyfunc model predicts its raw rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client
from mlflow.tracking import MlflowClient

from flows.params import InferenceParams, PipelineParams
from flows.pipeline import batch_inference_flow, pipeline
from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.driver.cluster import DaskConfig
from tracking.config import TrackingConfig
from tracking.lifecycle.scoring import load_classifier, predictions
from training.config import LoaderConfig, TrainConfig
from training.launch import LocalJob, RetryPolicy

pytestmark = pytest.mark.slow
LABEL = "Species (label)"
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


def hostile_table(num_rows: int, seed: int) -> pa.Table:
    """Three classes the numeric columns separate; nulls in `Body Mass (g)`."""
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 3, num_rows)
    mass = pa.array(
        3_000 + 500 * label + rng.normal(0, 100, num_rows),
        pa.float64(),
        mask=rng.random(num_rows) < 0.1,
    )
    numbers = {name: 10 * label + rng.normal(0, 1, num_rows) for name in FEATURES[1:4]}
    return pa.table(
        {
            LABEL: pa.array([f"kind {k}" for k in label]),
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
) -> tuple[Path, str, dict]:
    """The pipeline on the session's Dask cluster (as the promotion tests run): a cluster
    of its own would cost its start and check nothing about names."""
    work = tmp_path_factory.mktemp("hostile")
    (work / "raw").mkdir()
    for part in range(3):
        pq.write_table(hostile_table(120, part), work / "raw" / f"part {part}.parquet")
    tracking = TrackingConfig(
        tracking_uri=mlflow_uri, experiment="hostile-names", registered_model_name="hostile-names"
    )
    params = PipelineParams(
        reshard=ReshardConfig(
            dataset=DatasetSpec(
                inputs=[str(work / "raw")],
                label_column=LABEL,
                source_column=None,
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
    names and it predicts every raw row (a DataFrame read from the files, label dropped)
    as the in-process model does, probabilities summing to 1."""
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
    frame: pd.DataFrame = raw.drop_columns([LABEL]).to_pandas()
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
