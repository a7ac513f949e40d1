"""One pipeline run with both arms on tiny data, on the session's Prefect harness
(tests/conftest.py), that the tests of its results and of what the Prefect API shows of it
read."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect.client.schemas.objects import State

from flows.params import PipelineParams
from flows.pipeline import pipeline
from flows.results import PipelineResult
from preprocessing.config import DatasetSpec, ReshardConfig
from tracking.config import TrackingConfig
from training.config import LoaderConfig, TrainConfig
from training.launch import LocalJob, RetryPolicy


@pytest.fixture(scope="session")
def params(tiny_raw: Path, tmp_path_factory: pytest.TempPathFactory) -> PipelineParams:
    work = tmp_path_factory.mktemp("pipeline")
    return PipelineParams(
        reshard=ReshardConfig(
            # A validation split: training selects on it, the holdout judges the model.
            dataset=DatasetSpec(inputs=[str(tiny_raw)], id_column="id", validation_fraction=0.15),
            output_root=str(work / "datasets"),
            target_shard_rows=600,
        ),
        train=TrainConfig(
            dataset=str(work / "datasets"),
            output_dir=str(work / "job"),
            max_epochs=2,
            loader=LoaderConfig(batch_size=32),
            tracking=TrackingConfig(
                tracking_uri=f"sqlite:///{work}/mlflow.db",
                experiment="e2e",
                registered_model_name="e2e-classifier",
            ),
        ),
        job=LocalJob(num_processes_per_node=2, retry=RetryPolicy(attempts=1)),
        compare_with_natural_mix=True,
    )


@pytest.fixture(scope="session")
def first_state(prefect_harness: None, params: PipelineParams) -> State:
    """The final state of the first pipeline run (both arms), which the other tests read."""
    return pipeline(**params.arguments(), return_state=True)


@pytest.fixture(scope="session")
def first_run(first_state: State) -> PipelineResult:
    result: PipelineResult = first_state.result()
    return result
