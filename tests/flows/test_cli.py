"""Presets, the shipped infra/prefect.yaml and the CLI's errors, without running flows."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml
from prefect.utilities.callables import parameter_schema

from flows.cli.main import apply_override, main
from flows.deployments import DEPLOYMENTS, FLOWS, preset_parameters, render_prefect_yaml
from flows.overrides import NO_OVERRIDES
from flows.params import PRESETS_DIR, PipelineParams, ReshardParams, ballast_flow, load_preset
from flows.pipeline import pipeline

REPO = Path(__file__).resolve().parents[2]


def test_every_shipped_preset_loads() -> None:
    """Invariant: each preset validates against the parameters of a flow that uses it (the
    presets no deployment uses, demo and compose, against the pipeline's)."""
    used = {spec.preset: spec for spec in DEPLOYMENTS}
    for path in sorted(PRESETS_DIR.glob("*.yaml")):
        if path.stem not in used:
            PipelineParams.model_validate(load_preset(path.stem, "/tmp/w"))
        else:
            parameters = preset_parameters(used[path.stem], "/tmp/w")
            assert list(parameters) == list(FLOWS[used[path.stem].flow][1].model_fields)


def test_shipped_prefect_yaml_matches_the_deployments_table() -> None:
    """Invariant: infra/prefect.yaml is exactly what `ballast deployments` renders, and its
    nightly deployment is scheduled with a concurrency limit of one (CANCEL_NEW)."""
    shipped = (REPO / "infra" / "prefect.yaml").read_text()
    assert shipped == render_prefect_yaml()
    nightly = yaml.safe_load(shipped)["deployments"][0]
    assert nightly["schedules"][0]["cron"] == "0 2 * * *"
    assert nightly["concurrency_limit"] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}
    assert set(FLOWS) >= {entry.flow for entry in DEPLOYMENTS}


def test_run_rejects_a_bad_field_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Invariant: `ballast run` with an invalid override exits 2 and names the field."""
    code = main(
        [
            "run",
            "pipeline",
            "--config",
            "demo",
            "--work-dir",
            "/tmp/w",
            "--set",
            "train.max_epochs=-1",
        ]
    )
    assert code == 2
    assert "train.max_epochs" in capsys.readouterr().err


def test_run_names_a_missing_config_file(capsys: pytest.CaptureFixture[str]) -> None:
    """Invariant: an unknown config is an error naming it and listing the shipped presets."""
    assert main(["run", "reshard", "--config", "nope.yaml"]) == 2
    error = capsys.readouterr().err
    assert "nope.yaml" in error and "nightly" in error


def test_overrides_set_nested_fields_parsed_as_yaml() -> None:
    """Invariant: --set a.b.c=VALUE creates the path and parses the value as YAML."""
    values: dict = {"a": {"x": 1}}
    apply_override(values, "a.b.c=[1, 2]")
    apply_override(values, "a.x=false")
    assert values == {"a": {"x": False, "b": {"c": [1, 2]}}}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        apply_override(values, "no-equals-sign")


def test_run_help_lists_every_shipped_preset(capsys: pytest.CaptureFixture[str]) -> None:
    """Invariant: `ballast run --help` names each preset in flows/presets/."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    shown = capsys.readouterr().out
    assert all(f"  {path.stem} " in shown for path in PRESETS_DIR.glob("*.yaml"))


def test_validation_errors_name_each_field_without_documentation_links(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Invariant: the error is one line naming every bad field as `field.path: problem
    (got value)`, and no pydantic documentation link is printed."""
    code = main(
        [
            "run",
            "pipeline",
            "--config",
            "demo",
            "--work-dir",
            "/tmp/w",
            "--set",
            "train.max_epochs=-1",
            "--set",
            "reshard.bogus=1",
        ]
    )
    error = capsys.readouterr().err
    assert code == 2 and "errors.pydantic.dev" not in error and "http" not in error
    assert error.count("\n") == 1 and "(2 problem(s))" in error
    assert "train.max_epochs: Input should be greater than 0 (got -1)" in error
    assert "reshard.bogus: Extra inputs are not permitted (got 1)" in error


def test_each_flow_takes_its_models_fields_as_named_described_parameters() -> None:
    """Invariant: a flow's Prefect parameter schema (what the deployment's Parameters tab
    and run form show) has one named property per field of its parameter model, in order,
    each with the field's description and the model's required fields required, then the
    run's `overrides`; no flow takes one `params` blob."""
    for name, (flow_object, params_type) in FLOWS.items():
        schema = parameter_schema(flow_object.fn)
        fields = params_type.model_fields
        assert list(schema.properties) == [*fields, "overrides"], name
        for field_name, field in fields.items():
            described = schema.properties[field_name]["description"]
            assert described == " ".join(str(field.description).split()), (name, field_name)
        assert set(schema.required) == {n for n, f in fields.items() if f.is_required()}


def test_a_model_holding_caller_runs_a_flow_with_its_arguments() -> None:
    """Invariant: `params.arguments()` are the flow's keyword arguments, sections kept as
    the validated models (so `flow(**params.arguments())` runs what the file said)."""
    params = PipelineParams.model_validate(load_preset("demo", "/tmp/w"))
    arguments = params.arguments()
    assert [*arguments, "overrides"] == [*inspect.signature(pipeline.fn).parameters]
    assert arguments["reshard"] is params.reshard and arguments["job"] is params.job


def test_a_flow_whose_parameters_drift_from_its_model_fails_at_import() -> None:
    """Invariant: a flow missing a field of its model, or with another default, is refused
    when it is defined, naming the parameter, not when a deployment runs it."""
    from preprocessing.config import ReshardConfig

    def missing(*, reshard: ReshardConfig) -> None: ...

    def other_default(
        *, reshard: ReshardConfig, dask: object = None, overrides: list[str] = NO_OVERRIDES
    ) -> None: ...

    with pytest.raises(TypeError, match=r"parameters \['reshard'\] are not the fields"):
        ballast_flow("x", ReshardParams)(missing)
    with pytest.raises(TypeError, match="the default of dask is None"):
        ballast_flow("x", ReshardParams)(other_default)
