"""`ballast serve`: the deployment table served from this process, over no deployment that
`ballast serve` did not create.

A deployment that `prefect deploy` put on a work pool has the same flow and name as the
served one (`pipeline/nightly`): serving it would take it over (the runner drops its work
pool and pull steps), and stopping the serve would pause it and delete its scheduled runs
(docs/architecture.md M16). So serve first reads each of its deployments on the server and
refuses, naming the deployment and its work pool, when one exists without the tag that
served deployments carry.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import serve
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import StateType
from prefect.deployments.runner import RunnerDeployment
from prefect.exceptions import ObjectNotFound

from flows.deployments import SERVED_TAG, build_deployments
from flows.temporary_server import start_temporary_server


class DeploymentTaken(ValueError):
    """A deployment of the table exists on the server and was not made by `ballast serve`."""


def serve_deployments(work_dir: str | Path) -> str:
    """Serve the table's deployments until interrupted (Ctrl-C, SIGTERM); what stopping
    did. Raises DeploymentTaken, serving nothing, when one is another's."""
    deployments = build_deployments(work_dir)
    start_temporary_server()
    taken = foreign_deployments(deployments)
    if taken:
        raise DeploymentTaken(
            f"ballast serve would take over {', '.join(taken)}, made by `prefect deploy` or "
            "another tool: serving it moves its runs off its work pool, and stopping the "
            "serve pauses it and deletes its scheduled runs. Leave those schedules to the "
            "pool's worker, delete the deployments first (`prefect deployment delete "
            "NAME`), or serve against another Prefect server (PREFECT_API_URL)"
        )
    serve(*deployments)  # returns once interrupted
    remove_scheduled_runs(deployments)
    return serve_stopped_message(deployments)


def remove_scheduled_runs(deployments: list[RunnerDeployment]) -> int:
    """Delete the scheduled runs still held by those of `deployments` that are paused; how
    many. Prefect's runner pauses its deployments when it stops, and the server drops their
    scheduled runs, but its scheduler may insert a round of runs in that same moment (3
    runs were left once in three suite runs): a stopped serve leaves none."""
    scheduled = FlowRunFilter(
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
    )
    removed = 0
    with get_client(sync_client=True) as client:
        for _, existing in _on_server(client, deployments):
            if not existing.paused:
                continue
            own = DeploymentFilter(id=DeploymentFilterId(any_=[existing.id]))
            for run in client.read_flow_runs(deployment_filter=own, flow_run_filter=scheduled):
                client.delete_flow_run(run.id)
                removed += 1
    return removed


def _on_server(
    client: SyncPrefectClient, deployments: list[RunnerDeployment]
) -> Iterator[tuple[str, Any]]:
    """`flow/name` and the server's record of each of `deployments` that exists there."""
    for deployment in deployments:
        try:
            yield deployment.full_name, client.read_deployment_by_name(deployment.full_name)
        except ObjectNotFound:
            continue


def foreign_deployments(deployments: list[RunnerDeployment]) -> list[str]:
    """`flow/name (work pool P)` of each of `deployments` that exists on the server without
    the served tag."""
    taken = []
    with get_client(sync_client=True) as client:
        for name, existing in _on_server(client, deployments):
            if SERVED_TAG not in existing.tags:
                pool = existing.work_pool_name or "none"
                taken.append(f"{name} (work pool {pool!r})")
    return taken


def serve_stopped_message(deployments: list[RunnerDeployment]) -> str:
    """What stopping `ballast serve` did: Prefect pauses the deployments it served and
    removes their scheduled runs (docs/architecture.md M16), so nothing runs until served
    again or resumed."""
    names = ", ".join(deployment.full_name for deployment in deployments)
    return (
        f"ballast serve stopped: paused the deployments it served ({names}) and removed "
        "their scheduled runs; nothing runs on their schedules until `ballast serve` "
        "runs again."
    )
