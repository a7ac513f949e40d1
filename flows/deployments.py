"""Deployments: which flow runs on which schedule with which preset, in one table.

`build_deployments` turns the table into Prefect deployments that `ballast serve` serves
(no work pool needed; flows/serving.py); `render_prefect_yaml` writes the same table as
`infra/prefect.yaml` for `prefect deploy` onto a work pool. A test keeps the shipped file
equal to the table. The file names each flow by module path (`flows.pipeline.pipeline`)
and has no pull step: a worker imports the flows from the ballast installed beside it
(a checkout's virtualenv, an image), wherever that is. Rendered without a work dir, its
paths keep `${WORK_DIR}`, which a flow run fills from the worker's `BALLAST_WORK_DIR`
(flows/overrides.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from prefect import Flow
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import EntrypointType, RunnerDeployment

from flows.params import (
    EvaluateParams,
    FlowParams,
    InferenceParams,
    PipelineParams,
    ReshardParams,
    TrainParams,
    load_preset,
    parse_params,
)
from flows.pipeline import (
    batch_inference_flow,
    evaluate_flow,
    pipeline,
    reshard_flow,
    train_flow,
)

FLOWS: dict[str, tuple[Flow[Any, Any], type[FlowParams]]] = {
    "pipeline": (pipeline, PipelineParams),
    "reshard": (reshard_flow, ReshardParams),
    "train": (train_flow, TrainParams),
    "evaluate": (evaluate_flow, EvaluateParams),
    "batch_inference": (batch_inference_flow, InferenceParams),
}
# Served deployments carry this tag: `ballast serve` serves over no deployment without it.
SERVED_TAG = "ballast-serve"


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment: a flow, its preset, an optional cron schedule, one run at a time."""

    name: str
    flow: str
    preset: str
    cron: str | None = None
    single_run: bool = False


DEPLOYMENTS = (
    DeploymentSpec("nightly", "pipeline", "nightly", cron="0 2 * * *", single_run=True),
    DeploymentSpec("adhoc", "reshard", "reshard"),
    DeploymentSpec("adhoc", "train", "train"),
    DeploymentSpec("adhoc", "batch_inference", "batch_inference"),
)


def preset_parameters(spec: DeploymentSpec, work_dir: str | Path | None) -> dict[str, Any]:
    """The flow's parameters from its preset, validated (a bad preset fails here): one
    named section per parameter (`reshard`, `dask`, `train`, ...), as the Prefect UI shows
    them; `work_dir` None keeps `${WORK_DIR}` in them."""
    _, params_type = FLOWS[spec.flow]
    params = parse_params(params_type, load_preset(spec.preset, work_dir), spec.preset)
    return params.model_dump(mode="json")


def _concurrency(spec: DeploymentSpec) -> ConcurrencyLimitConfig | None:
    if not spec.single_run:
        return None
    return ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)


def build_deployments(work_dir: str | Path) -> list[RunnerDeployment]:
    """Every deployment of the table, ready for `prefect.serve`."""
    deployments = [
        FLOWS[spec.flow][0].to_deployment(
            name=spec.name,
            cron=spec.cron,
            parameters=preset_parameters(spec, work_dir),
            concurrency_limit=_concurrency(spec),
            tags=["ballast", SERVED_TAG],
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        for spec in DEPLOYMENTS
    ]
    return [cast(RunnerDeployment, deployment) for deployment in deployments]


def _yaml_entry(spec: DeploymentSpec, work_dir: str | None) -> dict[str, Any]:
    flow_object = FLOWS[spec.flow][0]
    entry: dict[str, Any] = {
        "name": spec.name,
        "flow_name": flow_object.name,
        "tags": ["ballast"],
        "entrypoint": f"{flow_object.fn.__module__}.{flow_object.fn.__name__}",
        "parameters": preset_parameters(spec, work_dir),
        "work_pool": {"name": "ballast", "job_variables": {}},
    }
    if spec.cron:
        entry["schedules"] = [{"cron": spec.cron, "timezone": "UTC", "active": True}]
    if spec.single_run:
        entry["concurrency_limit"] = {"limit": 1, "collision_strategy": "CANCEL_NEW"}
    return entry


def render_prefect_yaml(work_dir: str | None = None) -> str:
    """`infra/prefect.yaml`: the same deployments for `prefect deploy` on a work pool;
    `work_dir` None keeps `${WORK_DIR}` for the worker's `BALLAST_WORK_DIR` to fill."""
    # `pull: []`, not omitted: `prefect deploy` would add a step entering the directory it
    # ran in, which exists on the deploying machine only.
    document = {
        "name": "ballast",
        "prefect-version": "3.9.1",
        "build": None,
        "push": None,
        "pull": [],
        "deployments": [_yaml_entry(spec, work_dir) for spec in DEPLOYMENTS],
    }
    filled = (
        f"with ${{WORK_DIR}} = {work_dir}"
        if work_dir
        else "with ${WORK_DIR} filled by each flow run from $BALLAST_WORK_DIR"
    )
    header = (
        "# Generated by `ballast deployments > infra/prefect.yaml` from\n"
        "# flows/deployments.py and the presets in flows/presets/,\n"
        f"# {filled}.\n"
        "# A worker runs the flows of the ballast installed beside it (no pull step).\n"
    )
    return header + yaml.safe_dump(document, sort_keys=False, width=100)
