"""A real dataset end to end through the flows: scikit-learn's wine data as CSV files with
nulls -> pipeline (reshard, 1-process training, evaluation on Dask, registry) ->
batch_inference on the raw CSV files -> the champion predicting on a pandas DataFrame."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client

from flows.arms import NATURAL_MIX
from flows.params import InferenceParams, PipelineParams
from flows.pipeline import batch_inference_flow, pipeline
from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.driver.cluster import DaskConfig
from tracking.config import TrackingConfig
from training.config import LoaderConfig, TrainConfig
from training.launch import LocalJob, RetryPolicy
from training.models.config import ModelConfig

pytestmark = pytest.mark.slow
NULLS = {"magnesium": "fill_mean", "color_intensity": "indicator"}


def wine_csv_files(directory: Path) -> pd.DataFrame:
    """The wine data (178 rows, 13 numeric columns, 3 classes) as 4 CSV files with 10% of
    two columns null; the frame as written."""
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).frame.sample(frac=1.0, random_state=3)
    frame.insert(0, "id", range(len(frame)))
    rng = np.random.default_rng(3)
    for column in NULLS:
        frame[column] = frame[column].mask(rng.random(len(frame)) < 0.1)
    directory.mkdir()
    bounds = np.linspace(0, len(frame), 5).astype(int)
    for index, (low, high) in enumerate(pairwise(bounds)):
        frame.iloc[low:high].to_csv(directory / f"wine-{index}.csv", index=False)
    return frame


@pytest.fixture(scope="module")
def wine_run(prefect_harness: None, dask_client: Client, tmp_path_factory: pytest.TempPathFactory):
    """The pipeline on the session's Dask cluster (as the promotion tests run): a cluster
    of its own would cost its start and check nothing about the data."""
    work = tmp_path_factory.mktemp("wine-flow")
    frame = wine_csv_files(work / "raw")
    features = [name for name in frame.columns if name not in ("id", "target")]
    tracking = TrackingConfig(
        tracking_uri=f"sqlite:///{work}/mlflow.db", experiment="wine", registered_model_name="wine"
    )
    params = PipelineParams(
        reshard=ReshardConfig(
            dataset=DatasetSpec(
                inputs=[str(work / "raw")],
                label_column="target",
                source_column=None,
                feature_columns=features,
                nulls=NULLS,
            ),
            output_root=str(work / "datasets"),
            target_shard_rows=60,
            rows_per_row_group=32,
            holdout_fraction=0.25,
            mix=MixConfig(class_weighting="natural"),
        ),
        train=TrainConfig(
            dataset=str(work / "datasets"),
            output_dir=str(work / "job"),
            max_epochs=25,
            loader=LoaderConfig(batch_size=16),
            model=ModelConfig(hidden_sizes=[32], learning_rate=0.01),
            tracking=tracking,
        ),
        job=LocalJob(num_processes_per_node=1, retry=RetryPolicy(attempts=1)),
        dask=DaskConfig(kind="address", address=dask_client.scheduler.address),
    )
    return work, frame, tracking, pipeline(**params.arguments())


def test_the_champion_predicts_on_raw_rows_as_batch_inference_does(
    wine_run, dask_client: Client
) -> None:
    """Invariants: the model beats the class-prior baseline on held-out rows and becomes
    champion; batch inference over the raw CSV files (nulls and all) predicts every row;
    `models:/wine@champion` loaded with mlflow.pyfunc predicts on a DataFrame of the
    original feature columns the same label for every row (in the label's own type), with
    probabilities summing to 1,
    and the right label on most held-out rows."""
    import mlflow

    work, frame, tracking, result = wine_run
    scores = result.evaluations[NATURAL_MIX]  # trained on the natural mix
    assert scores.beats_class_prior and scores.macro_f1 >= 0.8
    assert result.registration.alias == "champion"
    out = batch_inference_flow(
        **InferenceParams(
            model_uri="models:/wine@champion",
            tracking=tracking,
            inputs=sorted(str(p) for p in (work / "raw").iterdir()),
            id_column="id",
            output_root=str(work / "predictions"),
            dask=DaskConfig(kind="address", address=dask_client.scheduler.address),
        ).arguments()
    )
    manifest, location = read_manifest(out.manifest_uri)
    batch = pa.concat_tables(
        pq.read_table(shard_uri(location, entry)) for entry in manifest.split("predictions").shards
    )
    by_id = dict(
        zip(batch.column("id").to_pylist(), batch.column("predicted").to_pylist(), strict=True)
    )
    mlflow.set_tracking_uri(tracking.tracking_uri)
    champion = mlflow.pyfunc.load_model("models:/wine@champion")
    served = champion.predict(frame.drop(columns=["id", "target"]), params={"details": True})
    assert served["predicted"].dtype == frame["target"].dtype  # the label's own type
    assert [by_id[i] for i in frame["id"]] == served["predicted"].astype(str).tolist()
    np.testing.assert_allclose(np.stack(served["probabilities"]).sum(axis=1), 1.0, rtol=1e-5)
    source, source_location = read_manifest(result.manifest_uri)
    held = {
        i
        for entry in source.split("holdout").shards
        for i in pq.read_table(shard_uri(source_location, entry)).column("id").to_pylist()
    }
    right = (served["predicted"] == frame["target"].to_numpy())[frame["id"].isin(held)]
    assert right.mean() >= 0.8
