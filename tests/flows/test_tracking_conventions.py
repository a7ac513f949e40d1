"""MLflow's conventions as ballast's defaults: the tracking URI and experiment come from what
the user wrote, else MLFLOW_TRACKING_URI / MLFLOW_EXPERIMENT_NAME, else the preset; on an
HTTP server a preset's artifact location gives way to the server's proxy; `ballast status`
resolves the same values as `ballast run`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows.cli.values import resolved_values

SERVER = "http://127.0.0.1:5999"
ENV = {"MLFLOW_TRACKING_URI": SERVER, "MLFLOW_EXPERIMENT_NAME": "from-env"}


def test_the_environment_beats_a_shipped_preset_and_drops_its_artifact_location() -> None:
    """Invariants: with the variables set, the demo preset's sqlite URI and experiment give
    way to them, its local artifact location is dropped (artifacts through the server),
    and the line the run prints names the variable; without them the preset stands."""
    values, lines = resolved_values("demo", "/w", [], ENV)
    tracking = values["train"]["tracking"]
    assert (tracking["tracking_uri"], tracking["experiment"]) == (SERVER, "from-env")
    assert tracking["artifact_location"] is None
    assert "from $MLFLOW_TRACKING_URI" in lines[0] and "artifact proxy" in lines[0]
    values, lines = resolved_values("demo", "/w", [], {})
    assert values["train"]["tracking"]["tracking_uri"] == "sqlite:////w/mlflow.db"
    assert values["train"]["tracking"]["artifact_location"] == "/w/mlartifacts"
    assert "from the preset" in lines[0]


def test_what_the_user_wrote_beats_the_environment(tmp_path: Path) -> None:
    """Invariants: a `--set` URI beats the variable on a preset; a URI and an artifact
    location in the user's own file are kept whatever the environment says; a file
    without a URI takes the variable's."""
    values, lines = resolved_values(
        "demo", "/w", ["train.tracking.tracking_uri=sqlite:///mine.db"], ENV
    )
    assert values["train"]["tracking"]["tracking_uri"] == "sqlite:///mine.db"
    assert "from --set" in lines[0]
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        yaml.safe_dump(
            {
                "tracking": {
                    "tracking_uri": "http://mine:5000",
                    "artifact_location": "s3://bucket/art",
                }
            }
        )
    )
    values, _ = resolved_values(str(mine), "/w", [], ENV)
    assert values["tracking"] == {
        "tracking_uri": "http://mine:5000",
        "artifact_location": "s3://bucket/art",
        "experiment": "from-env",
    }
    mine.write_text(yaml.safe_dump({"tracking": {"registered_model_name": "m"}}))
    values, lines = resolved_values(str(mine), "/w", [], ENV)
    assert values["tracking"]["tracking_uri"] == SERVER and "$MLFLOW_TRACKING_URI" in lines[0]


def test_a_bad_override_names_itself() -> None:
    """Invariant: an override without `=` is refused naming it."""
    with pytest.raises(ValueError, match=r"--set 'train\.max_epochs'"):
        resolved_values("demo", "/w", ["train.max_epochs"], {})


@pytest.mark.slow
def test_a_run_with_the_variable_exported_lands_on_the_server_and_status_finds_the_champion(
    tiny_raw, tmp_path, dask_client, mlflow_uri, monkeypatch
) -> None:
    """Invariants (a real `mlflow server`, MLFLOW_TRACKING_URI exported, no URI written):
    the demo preset's run is created on the server, its manifest artifact stored through
    the server's proxy (`mlflow-artifacts:`, not the preset's local folder); `ballast
    status` with the same `--set` finds the champion registered there."""
    import uuid

    from mlflow.tracking import MlflowClient

    from flows.cli.status import describe_status
    from preprocessing.config import DatasetSpec, ReshardConfig
    from preprocessing.driver.reshard import run_reshard
    from tracking.config import TrackingConfig
    from tracking.run.runs import finish_run, start_run

    name = f"conventions-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", name)
    overrides = [f"train.tracking.registered_model_name={name}"]
    values, _ = resolved_values("demo", str(tmp_path), overrides)
    config = TrackingConfig.model_validate(values["train"]["tracking"])
    result = run_reshard(
        ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tiny_raw)]), output_root=str(tmp_path / "out")
        ),
        dask_client,
    )
    run_id = start_run(config, result.manifest, result.manifest_uri, {}, {})
    finish_run(config, run_id, {"val_macro_f1": 0.5})
    client = MlflowClient(mlflow_uri)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == name
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")
    assert not (tmp_path / "mlartifacts").exists()
    client.create_registered_model(name)
    client.set_registered_model_alias(
        name,
        "champion",
        client.create_model_version(name, f"runs:/{run_id}/dataset", run_id=run_id).version,
    )
    assert f"champion: {name} v1" in describe_status("demo", str(tmp_path), overrides)


def test_a_deployment_run_takes_the_workers_environment_as_ballast_run_does(monkeypatch) -> None:
    """Invariants: the nightly deployment's parameters as infra/prefect.yaml holds them (its
    preset's sqlite URI and local artifact folder), in a run a worker or `ballast serve`
    started (PREFECT__FLOW_RUN_ID set) with MLflow's variables exported, take the variables'
    values and go through the server's artifact proxy; an override of the URI wins over the
    variable; a flow called in-process (`ballast run`, resolved before) keeps its values."""
    from flows.deployments import DEPLOYMENTS, preset_parameters
    from flows.overrides import resolve_parameters
    from flows.params import PipelineParams

    nightly = next(spec for spec in DEPLOYMENTS if spec.name == "nightly")
    parameters = preset_parameters(nightly, None)
    monkeypatch.setenv("BALLAST_WORK_DIR", "/w")
    worker = {**ENV, "PREFECT__FLOW_RUN_ID": "0b5e1f0c"}
    tracking = resolve_parameters(PipelineParams, parameters, worker)["train"].tracking
    assert (tracking.tracking_uri, tracking.experiment) == (SERVER, "from-env")
    assert tracking.artifact_location is None
    mine = {**parameters, "overrides": ["train.tracking.tracking_uri=sqlite:///mine.db"]}
    tracking = resolve_parameters(PipelineParams, mine, worker)["train"].tracking
    assert (tracking.tracking_uri, tracking.experiment) == ("sqlite:///mine.db", "from-env")
    tracking = resolve_parameters(PipelineParams, parameters, ENV)["train"].tracking
    assert tracking.tracking_uri == "sqlite:////w/mlflow.db"
    assert tracking.artifact_location == "/w/mlartifacts"
