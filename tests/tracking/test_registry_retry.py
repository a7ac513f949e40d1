"""Against the real MLflow server: logging the model leaves the job's run open (only the
lifecycle in tracking/run/runs.py closes it), a failed job's run is closed FAILED with its
reason, and registering is idempotent: a retry after a lost reply reuses its run's
version instead of adding a second one."""

from __future__ import annotations

import uuid

import pytest
import torch
from mlflow.tracking import MlflowClient

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.codec import FeatureCodec
from preprocessing.driver.reshard import run_reshard
from tracking.config import TrackingConfig
from tracking.lifecycle.champion import LEGACY_SCORE_TAG, champion
from tracking.lifecycle.registry import register_and_promote
from tracking.run.model import log_model
from tracking.run.runs import FAILURE_TAG, create_run, fail_run

pytestmark = pytest.mark.slow


@pytest.fixture
def logged_model(tiny_raw, tmp_path, dask_client, mlflow_uri) -> tuple[TrackingConfig, str, str]:
    """(tracking config, run id, model URI): an untrained network logged to a fresh run."""
    result = run_reshard(
        ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tiny_raw)]), output_root=str(tmp_path / "ds")
        ),
        dask_client,
    )
    config = TrackingConfig(
        tracking_uri=mlflow_uri,
        experiment=f"reg-{uuid.uuid4().hex[:6]}",
        registered_model_name=f"clf-{uuid.uuid4().hex[:6]}",
    )
    run_id = create_run(config)
    width = FeatureCodec.from_manifest(result.manifest).width
    network = torch.nn.Linear(width, len(result.manifest.classes))
    return config, run_id, log_model(config, run_id, network, result.manifest_uri)


def test_logging_the_model_keeps_the_run_open_and_a_retried_registration_reuses_its_version(
    logged_model,
) -> None:
    """Invariants: after `log_model` the run is still RUNNING (nothing but the lifecycle
    ends it); registering the same run's model twice (a retry after a lost reply) yields
    one version, the champion both times, reporting the same previous champion score."""
    config, run_id, model_uri = logged_model
    client = MlflowClient(config.tracking_uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    name = str(config.registered_model_name)
    first = register_and_promote(config, model_uri, name, 0.7)
    again = register_and_promote(config, model_uri, name, 0.7)
    versions = client.search_model_versions(f"name = '{name}'")
    assert [v.version for v in versions] == [str(first["version"])]
    assert first == again and first["alias"] == "champion"
    assert client.get_run(run_id).info.status == "RUNNING"


def test_a_champion_scored_under_the_old_tag_still_compares(logged_model) -> None:
    """Invariant: a champion registered before the score tag was renamed (only
    `ballast.val_macro_f1`) is read with that score, the one a newcomer is compared with."""
    config, run_id, model_uri = logged_model
    client = MlflowClient(config.tracking_uri)
    name = f"old-{uuid.uuid4().hex[:6]}"
    client.create_registered_model(name)
    old = client.create_model_version(
        name,
        model_uri,
        run_id=run_id,
        tags={LEGACY_SCORE_TAG: "0.9"},
        model_id=model_uri.removeprefix("models:/"),
    )
    client.set_registered_model_alias(name, "champion", old.version)
    assert champion(config.tracking_uri, name) == {
        "version": int(old.version),
        "run_id": run_id,
        "score": 0.9,
    }


def test_a_failed_run_is_closed_failed_with_its_reason(mlflow_uri) -> None:
    """Invariant: `fail_run` ends the run FAILED and tags the (redacted) reason."""
    config = TrackingConfig(tracking_uri=mlflow_uri, experiment=f"fail-{uuid.uuid4().hex[:6]}")
    run_id = create_run(config)
    fail_run(config, run_id, "training exited with status 1: see http://ada:pw@host/x")
    run = MlflowClient(mlflow_uri).get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[FAILURE_TAG] == "training exited with status 1: see http://ada:***@host/x"
