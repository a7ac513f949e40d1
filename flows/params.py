"""Flow parameters: pydantic models, so the Prefect UI renders forms and rejects bad input,
and the flow type that records them in Prefect with their credentials redacted.

Each flow takes its model's fields as named, typed parameters (`reshard`, `dask`, `train`,
`job`, ...), not one `params` object: Prefect's parameter schema then has one section per
field, which the deployment's Parameters tab and run form show by name, each described
by the model's field description (`ballast_flow` writes them into the flow's docstring,
where Prefect reads parameter descriptions). A caller holding a model calls
`flow(**params.arguments())`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Flow
from pydantic import BaseModel, ConfigDict, Field

from flows.overrides import (
    OVERRIDES,
    OVERRIDES_DESCRIPTION,
    resolve_parameters,
)

# The presets live in a module of their own, which `ballast run` reads before it imports
# Prefect (flows/presets.py); re-exported here, where callers found them.
from flows.presets import PRESETS_DIR as PRESETS_DIR
from flows.presets import load_preset as load_preset
from flows.presets import preset_location as preset_location
from preprocessing.config import ReshardConfig
from preprocessing.driver.cluster import DaskConfig
from preprocessing.toolbox.config_files import parse_config
from preprocessing.toolbox.secrets import redact_value
from tracking.config import TrackingConfig
from tracking.lifecycle.promotion import PromotionConfig
from training.config import TrainConfig
from training.launch import LaunchConfig, LocalJob

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=BaseModel)
RESHARD_DESCRIPTION = (
    "Raw files in, one balanced, committed dataset version out: the "
    "dataset's columns, the class and source mix, shuffle, shard sizes."
)
TRACKING_DESCRIPTION = "The MLflow server (or store) the model is read from."
JOB_DESCRIPTION = (
    "Where the training job runs and how it is retried (training/launch/): "
    "by default torchrun on this machine, 2 processes, 2 attempts."
)


class FlowParams(BaseModel):
    """The parameters of one flow; its fields are the flow's parameters."""

    model_config = ConfigDict(extra="forbid")

    def arguments(self) -> dict[str, Any]:
        """The flow's keyword arguments: each field as it is (sections stay models)."""
        return {name: getattr(self, name) for name in type(self).model_fields}


class ReshardParams(FlowParams):
    """The `reshard` flow: raw files in, one committed dataset version out."""

    reshard: ReshardConfig = Field(description=RESHARD_DESCRIPTION)
    dask: DaskConfig = Field(default_factory=DaskConfig, description="Where Dask runs.")


class TrainParams(FlowParams):
    """The `train` flow: one tracked training job on a dataset version."""

    train: TrainConfig = Field(
        description="The training job: its dataset version, model, "
        "loader, precision and MLflow tracking."
    )
    job: LaunchConfig = Field(default_factory=LocalJob, description=JOB_DESCRIPTION)


class EvaluateParams(FlowParams):
    """The `evaluate` flow: a model (and optionally a baseline) on a held-out split."""

    model_uri: str = Field(description="`models:/<name>@champion` or another model URI.")
    dataset: str = Field(description="Dataset version to score on (manifest, version or root).")
    tracking: TrackingConfig = Field(description=TRACKING_DESCRIPTION)
    baseline_model_uri: str | None = Field(None, description="A model to compare against.")
    split: str = Field("holdout", description="The split of the version to score on.")
    dask: DaskConfig = Field(
        default_factory=DaskConfig, description="Where Dask runs (one task per shard)."
    )


class InferenceParams(FlowParams):
    """The `batch_inference` flow: predictions over a dataset, as a new dataset version."""

    model_uri: str = Field(description="Model to load from MLflow.")
    tracking: TrackingConfig = Field(description=TRACKING_DESCRIPTION)
    dataset: str | None = Field(None, description="A dataset version to predict on.")
    inputs: list[str] = Field(default_factory=list, description="Or any Parquet files/globs.")
    split: str = Field("train", description="Split of `dataset` to predict on.")
    id_column: str | None = Field(
        None,
        description="Row id column carried to the predictions (the feature columns are "
        "those of the model's codec); None (the default): the id column of `dataset`'s "
        "manifest, its configured one or the derived `__ballast_row_id`. Needed with "
        "`inputs` alone.",
    )
    output_root: str = Field(description="Predictions are committed as versions here.")
    dask: DaskConfig = Field(default_factory=DaskConfig, description="Where Dask runs.")


class PipelineParams(FlowParams):
    """reshard -> train -> evaluate -> register, as one flow run."""

    reshard: ReshardConfig = Field(description=RESHARD_DESCRIPTION)
    dask: DaskConfig = Field(default_factory=DaskConfig, description="Where Dask runs.")
    train: TrainConfig = Field(
        description="Training job; its `dataset` is replaced by the version the reshard made."
    )
    job: LaunchConfig = Field(default_factory=LocalJob, description=JOB_DESCRIPTION)
    compare_with_natural_mix: bool = Field(
        False,
        description="Also train on the un-rebalanced data (natural class mix) and "
        "evaluate both on the same held-out rows, to show what rebalancing bought.",
    )
    promotion: PromotionConfig = Field(
        default_factory=PromotionConfig,
        description="When the night's model becomes "
        "`champion`: it must beat the champion on the same held-out rows, and the data must "
        "not drift past these thresholds against the parent version (else `challenger`).",
    )


def parse_params(params_type: type[M], values: dict[str, Any], name_or_path: str) -> M:
    """`values` (of preset or file `name_or_path`) as `params_type`; a ValidationError
    titled with the file, naming the new place of a moved field and the closest known name
    of a misspelt one (preprocessing/toolbox/config_files.py)."""
    return parse_config(params_type, values, name_or_path)


class RedactingFlow(Flow[P, R]):
    """A flow whose parameters Prefect records (the flow run in its database and UI) with
    every credential redacted (preprocessing/toolbox/secrets.py); the flow itself gets them whole.
    Prefect records no values of task parameters, only which upstream results they are.
    Before Prefect validates a run's parameters, their `overrides` are applied and
    `${WORK_DIR}` filled (flows/overrides.py), against the flow's `params_type`."""

    def __init__(
        self, function: Callable[P, R], params_type: type[FlowParams], **options: Any
    ) -> None:
        super().__init__(function, **options)
        self.params_type = params_type

    def validate_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return super().validate_parameters(resolve_parameters(self.params_type, parameters))

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return dict(redact_value(super().serialize_parameters(parameters)))


def ballast_flow(
    name: str, params_type: type[FlowParams]
) -> Callable[[Callable[P, R]], RedactingFlow[P, R]]:
    """`@flow(name=..., log_prints=True)`, recording its parameters redacted; the function's
    parameters must be `params_type`'s fields, in order, with the same defaults, then
    `overrides`; their descriptions are the fields' (an `Args:` section of the docstring,
    which Prefect reads)."""

    def decorate(function: Callable[P, R]) -> RedactingFlow[P, R]:
        _check_signature(function, params_type)
        function.__doc__ = f"{inspect.getdoc(function)}\n\n{_args_section(params_type)}"
        return RedactingFlow(function, params_type, name=name, log_prints=True)

    return decorate


def _check_signature(function: Callable[..., Any], params_type: type[FlowParams]) -> None:
    """A flow whose parameters drifted from its model fails at import, naming both."""
    fields = params_type.model_fields
    signature = inspect.signature(function).parameters
    if list(signature) != [*fields, OVERRIDES]:
        raise TypeError(
            f"flow {function.__name__}: parameters {list(signature)} are not "
            f"the fields of {params_type.__name__} {list(fields)} and "
            f"{OVERRIDES!r}"
        )
    for field_name, field in fields.items():
        default = signature[field_name].default
        expected = (
            inspect.Parameter.empty
            if field.is_required()
            else field.get_default(call_default_factory=True)
        )
        if default != expected:
            raise TypeError(
                f"flow {function.__name__}: the default of {field_name} is "
                f"{default!r}, {params_type.__name__}'s is {expected!r}"
            )


def _args_section(params_type: type[FlowParams]) -> str:
    lines = [
        f"    {field_name}: {' '.join((field.description or field_name).split())}"
        for field_name, field in params_type.model_fields.items()
    ]
    lines.append(f"    {OVERRIDES}: {OVERRIDES_DESCRIPTION}")
    return "Args:\n" + "\n".join(lines)
