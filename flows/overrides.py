"""A flow run's parameters as a deployment gives them: one field changed by a `path=value`
override (as `ballast run --set` does) and `${WORK_DIR}` filled from `BALLAST_WORK_DIR`.

Every flow takes an `overrides` parameter (a list of `train.max_epochs=1` strings, shown
in the Prefect UI's run form). The flow type (flows/params.py) applies them to the run's
parameters before Prefect validates those, then validates the result against the flow's
parameter model: a bad override fails the run naming the field, as `--set` does.
Deployment files rendered without a work dir (the shipped `infra/prefect.yaml`) keep
`${WORK_DIR}` in their paths; a flow run fills it from the worker's `BALLAST_WORK_DIR`.

A deployment run (one a worker or `ballast serve`'s runner started: Prefect sets
`PREFECT__FLOW_RUN_ID` in its process) applies MLflow's conventions as `ballast run` does
(flows/conventions.py): its deployment's parameters are the preset's, so the process's
`MLFLOW_TRACKING_URI` / `MLFLOW_EXPERIMENT_NAME` win over them and an override wins over
both. A flow called in-process (`ballast run`) was resolved by its caller.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from flows.conventions import ENV_OF, apply_tracking_conventions
from preprocessing.toolbox.config_files import parse_config, parse_yaml_value

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
OVERRIDES = "overrides"
OVERRIDES_DESCRIPTION = (
    "Fields to change for this run, each `path=value` as `ballast run "
    "--set` takes them (`train.max_epochs=1`); the value is YAML."
)
NO_OVERRIDES: list[str] = []  # never mutated: the flow's default
WORK_DIR_PLACEHOLDER = "${WORK_DIR}"
WORK_DIR_VARIABLE = "BALLAST_WORK_DIR"
FLOW_RUN_VARIABLE = "PREFECT__FLOW_RUN_ID"  # set by Prefect in a worker's or runner's run


def apply_override(values: dict[str, Any], assignment: str, given_as: str = "--set") -> None:
    """Set a dotted key (`train.loader.batch_size=128`); the value is parsed as YAML under
    the bounds of a config file, its errors naming the `--set` (or the override) as given."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise ValueError(f"{given_as} {assignment!r}: expected KEY=VALUE")
    *parents, leaf = key.split(".")
    node = values
    for depth, part in enumerate(parents):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            section = ".".join(parents[: depth + 1])
            raise ValueError(f"{given_as} {assignment!r}: {section} is a value, not a section")
    node[leaf] = parse_yaml_value(raw, f"{given_as} {key}")


def fill_work_dir(values: Any) -> Any:
    """`values` with `${WORK_DIR}` in every string replaced by `$BALLAST_WORK_DIR`; an
    error naming the variable when a string holds the placeholder and it is not set."""
    if isinstance(values, dict):
        return {key: fill_work_dir(value) for key, value in values.items()}
    if isinstance(values, list):
        return [fill_work_dir(value) for value in values]
    if not isinstance(values, str) or WORK_DIR_PLACEHOLDER not in values:
        return values
    work_dir = os.environ.get(WORK_DIR_VARIABLE)
    if not work_dir:
        raise ValueError(
            f"parameter {values!r} holds {WORK_DIR_PLACEHOLDER}: export "
            f"{WORK_DIR_VARIABLE} for the worker (the directory of raw/, "
            "datasets/, mlflow.db), or deploy a file rendered by `ballast "
            "deployments --work-dir DIR`"
        )
    return values.replace(WORK_DIR_PLACEHOLDER, work_dir.rstrip("/"))


def holds_placeholder(values: Any) -> bool:
    """Whether any string in `values` holds `${WORK_DIR}`."""
    if isinstance(values, dict):
        return any(holds_placeholder(value) for value in values.values())
    if isinstance(values, list):
        return any(holds_placeholder(value) for value in values)
    return isinstance(values, str) and WORK_DIR_PLACEHOLDER in values


def resolve_parameters(
    params_type: type[M], parameters: dict[str, Any], environ: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """The run's `parameters` with its overrides applied, `${WORK_DIR}` filled and, in a
    deployment run, MLflow's environment variables applied (module docstring), as
    `params_type`'s fields (sections as models) plus `overrides`; unchanged when there is
    nothing to apply. Raises ValueError naming each bad field."""
    overrides = list(parameters.get(OVERRIDES) or [])
    values = {name: value for name, value in parameters.items() if name != OVERRIDES}
    from_env = bool(environ.get(FLOW_RUN_VARIABLE)) and any(map(environ.get, ENV_OF.values()))
    if not overrides and not from_env and not holds_placeholder(to_jsonable_python(values)):
        return parameters
    values = to_jsonable_python(values)
    for assignment in overrides:
        apply_override(values, assignment, "override")
    if from_env:
        overridden = {assignment.partition("=")[0] for assignment in overrides}
        for line in apply_tracking_conventions(values, True, overridden, environ):
            log.info("%s", line)
    model = _validated(params_type, fill_work_dir(values), overrides)
    return {
        **{name: getattr(model, name) for name in type(model).model_fields},
        OVERRIDES: overrides,
    }


def _validated(params_type: type[M], values: dict[str, Any], overrides: list[str]) -> M:
    """`values` as `params_type`; a one-line ValueError naming each bad field (a misspelt
    one with the closest known name) and the overrides applied."""
    try:
        return parse_config(params_type, values, "the flow run's parameters")
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}"
            for problem in error.errors(include_url=False)
        )
        raise ValueError(f"invalid parameters with overrides {overrides}: {problems}") from None
