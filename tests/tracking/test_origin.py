"""Runs as MLflow's UI reads them: the experiment's kind (training mode), each run's
Source, Created by and parent, with a real local store, and a night kept while its server
was down delivered to a real `mlflow server` with its children still under it."""

from __future__ import annotations

import uuid
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

from tests.log_records import records_of
from tests.services import free_port
from tracking.config import RunOrigin, TrackingConfig
from tracking.lifecycle.night import close_night, night_metrics, open_night
from tracking.run.origin import KIND_TAG, TRAINING_KIND, training_view_url
from tracking.run.runs import create_run, deliver
from tracking.run.spool import Spool

pytestmark = pytest.mark.slow  # a real store (a sqlite file, an `mlflow server`)
KINDS = ["genai_development", "finetuning", "forecasting", "", "Custom Model", "x" * 500]
FIXTURE_REUSED = HealthCheck.function_scoped_fixture  # one store for every example
texts = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=300)


def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_an_earlier_releases_experiment_turns_to_training_mode_its_runs_kept(tmp_path) -> None:
    """Invariant: a new experiment is created in training mode; one made by an earlier
    release (no kind) gets the kind, and its runs (only a `git_sha` tag) stay in it, listed
    beside the new ones."""
    uri = store(tmp_path)
    client = MlflowClient(uri)
    old_experiment = client.create_experiment("nightly")
    old = client.create_run(old_experiment, tags={"git_sha": "0" * 40}).info.run_id
    new = create_run(TrackingConfig(tracking_uri=uri, experiment="nightly"))
    assert client.get_experiment(old_experiment).tags[KIND_TAG] == TRAINING_KIND
    listed = {run.info.run_id for run in client.search_runs([old_experiment])}
    assert listed == {old, new}
    create_run(TrackingConfig(tracking_uri=uri, experiment="fresh"))
    assert client.get_experiment_by_name("fresh").tags[KIND_TAG] == TRAINING_KIND


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(kind=st.one_of(st.sampled_from(KINDS), texts))
def test_a_kind_someone_chose_is_kept_and_said(tmp_path, kind) -> None:
    """Invariant: whatever kind an experiment already names (MLflow's others, hostile
    text), ballast logs into it without changing it, and says so when it is not training.
    (A fresh experiment an example, replays included; the line is caught on the logger
    itself, as caplog's root handler may be replaced by Prefect's set-up: log_records.py.)"""
    uri, name = store(tmp_path), f"chosen-{uuid.uuid4().hex}"
    client = MlflowClient(uri)
    client.create_experiment(name, tags={KIND_TAG: kind})
    with records_of("tracking.run.origin") as records:
        create_run(TrackingConfig(tracking_uri=uri, experiment=name))
    assert client.get_experiment_by_name(name).tags[KIND_TAG] == kind
    said = [r for r in records if "kept as it is" in r.getMessage() and name in r.getMessage()]
    assert len(said) == (kind != TRAINING_KIND)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(source=texts, user=texts, job=st.booleans())
def test_source_and_user_read_back_as_given(tmp_path, source, user, job) -> None:
    """Invariant: the origin a flow gives (any text: a deployment's name, a user) is what
    MLflow shows as the run's Source and Created by, and a run's parent is its parent."""
    uri = store(tmp_path)
    origin = RunOrigin(source_name=source, source_type="JOB" if job else "LOCAL", user=user)
    config = TrackingConfig(tracking_uri=uri, experiment="origin", origin=origin)
    parent = create_run(config)
    child = create_run(config.model_copy(update={"parent_run_id": parent}))
    tags = MlflowClient(uri).get_run(child).data.tags
    assert tags["mlflow.source.name"] == source and tags["mlflow.user"] == user
    assert tags["mlflow.source.type"] == origin.source_type
    assert tags["mlflow.parentRunId"] == parent


def test_a_night_kept_while_the_server_was_down_keeps_its_children(tmp_path, mlflow_uri) -> None:
    """Fault: the server is down through a night (its run, an arm's run, the close).
    Invariant: delivering the child sends the parent first, and the child names the
    parent's id on the server; the parent arrives FINISHED with the night's metrics."""
    down = TrackingConfig(
        tracking_uri=f"http://127.0.0.1:{free_port()}",
        experiment="kept-night",
        spool_dir=str(tmp_path / "spool"),
        delivery_wait_s=0.0,
    )
    evaluation = {
        "num_rows": 10,
        "macro_f1": 0.5,
        "balanced_accuracy": 0.5,
        "recall": {"a": 0.5},
        "class_prior_baseline": {"macro_f1": 0.1, "balanced_accuracy": 0.5},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        night = open_night(down, "night-kept", {})
        child = create_run(down.model_copy(update={"parent_run_id": night, "run_name": "arm"}))
        metrics = night_metrics({"arm": evaluation}, "arm", None)
        assert close_night(down, night, metrics, {"ballast.dataset_version": "v"}, {}) == night
    assert night.startswith("local-") and child.startswith("local-")
    up = down.model_copy(update={"tracking_uri": mlflow_uri})
    sent_child = deliver(Spool.of_run(up, child), up)
    sent_night = Spool.of_run(up, night).run["run_id"]
    client = MlflowClient(mlflow_uri)
    assert client.get_run(sent_child).data.tags["mlflow.parentRunId"] == sent_night
    parent = client.get_run(sent_night)
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["holdout_macro_f1"] == 0.5
    assert parent.data.tags["ballast.dataset_version"] == "v"
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags[KIND_TAG] == TRAINING_KIND
    view = f"#/experiments/{experiment.experiment_id}/runs/{sent_night}?workflowType="
    assert training_view_url(mlflow_uri, sent_night) == f"{mlflow_uri}/{view}machine_learning"
