"""A flow run's `overrides` and `${WORK_DIR}` (flows/overrides.py), applied as the flow
type validates a run's parameters, without running a flow."""

from __future__ import annotations

import pytest
from prefect.utilities.callables import parameter_schema

from flows.deployments import DEPLOYMENTS, FLOWS, preset_parameters
from flows.overrides import OVERRIDES, WORK_DIR_VARIABLE, resolve_parameters
from flows.params import PipelineParams, load_preset
from flows.pipeline import pipeline


def nightly_parameters() -> dict:
    """The nightly deployment's parameters as infra/prefect.yaml holds them."""
    return preset_parameters(DEPLOYMENTS[0], None)


def test_an_override_changes_one_field_and_work_dir_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariants: `train.max_epochs=1` changes that field alone; every `${WORK_DIR}` of the
    shipped parameters is filled from BALLAST_WORK_DIR; Prefect's own validation then
    accepts the result (the flow's signature)."""
    monkeypatch.setenv(WORK_DIR_VARIABLE, "/data/")
    shipped = nightly_parameters()
    assert shipped["train"]["max_epochs"] == 4 and "${WORK_DIR}" in shipped["train"]["dataset"]
    resolved = resolve_parameters(PipelineParams, {**shipped, OVERRIDES: ["train.max_epochs=1"]})
    assert resolved[OVERRIDES] == ["train.max_epochs=1"]
    train = resolved["train"]
    assert train.max_epochs == 1 and train.dataset == "/data/datasets"
    assert train.tracking.tracking_uri == "sqlite:////data/mlflow.db"
    assert resolved["reshard"].dataset.inputs == ["/data/raw"]
    unchanged = resolve_parameters(PipelineParams, {**shipped})["train"]
    assert unchanged.model_copy(update={"max_epochs": 1}) == train
    validated = pipeline.validate_parameters({**shipped, OVERRIDES: ["train.max_epochs=1"]})
    assert validated["train"].max_epochs == 1


@pytest.mark.parametrize(
    ("override", "named"),
    [
        (
            "train.max_epoch=1",
            "train.max_epoch: unknown field train.max_epoch; did you mean train.max_epochs?",
        ),
        ("train.max_epochs=-1", "train.max_epochs: "),
        ("train.max_epochs.x=1", "train.max_epochs is a value, not a section"),
        ("no-equals-sign", "expected KEY=VALUE"),
    ],
)
def test_a_bad_override_fails_naming_the_field(
    override: str, named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: a bad override is a one-line ValueError naming the field (and the known
    name closest to a misspelt one)."""
    monkeypatch.setenv(WORK_DIR_VARIABLE, "/data")
    with pytest.raises(ValueError) as error:
        pipeline.validate_parameters({**nightly_parameters(), OVERRIDES: [override]})
    assert named in str(error.value) and "\n" not in str(error.value)


def test_a_placeholder_without_the_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: `${WORK_DIR}` with BALLAST_WORK_DIR unset fails naming the variable and
    the command that writes fixed paths instead, not with a path of `${WORK_DIR}`."""
    monkeypatch.delenv(WORK_DIR_VARIABLE, raising=False)
    with pytest.raises(ValueError, match=r"export BALLAST_WORK_DIR.*ballast deployments"):
        resolve_parameters(PipelineParams, nightly_parameters())


def test_every_flow_shows_overrides_in_its_run_form() -> None:
    """Invariant: each flow's parameter schema (the UI's run form) ends with `overrides`, a
    list of strings described as `--set` is; its fields come first, as before."""
    for name, (flow, params_type) in FLOWS.items():
        properties = parameter_schema(flow).model_dump_for_openapi()["properties"]
        assert list(properties) == [*params_type.model_fields, OVERRIDES], name
        assert properties[OVERRIDES]["type"] == "array", name
        assert properties[OVERRIDES]["items"]["type"] == "string", name
        assert "--set" in properties[OVERRIDES]["description"], name


def test_parameters_without_overrides_or_placeholders_pass_through() -> None:
    """Invariant: a direct call's parameters (models, no overrides) are not re-validated
    by ballast: the same objects reach Prefect's validation."""
    params = PipelineParams.model_validate(load_preset("demo", "/tmp/w")).arguments()
    assert resolve_parameters(PipelineParams, params) is params
