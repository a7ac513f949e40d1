"""`ballast serve` against a real `prefect server` process on loopback: deployments with
schedules, a deployment run that completes, and the nightly concurrency limit."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.deployments import run_deployment
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.services import free_port, start_prefect_server, stop_server

TERMINAL = {"COMPLETED", "CANCELLED", "FAILED", "CRASHED"}


@contextmanager
def prefect_server(home: Path, database: Path) -> Iterator[dict[str, str]]:
    """A `prefect server` with its own home and a copy of the migrated `database`; yields
    the env that points at it."""
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
    }
    server = start_prefect_server(env, port, timeout_s=120, database=database)
    try:
        yield env
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def prefect_api(
    tmp_path_factory: pytest.TempPathFactory, prefect_database: Path
) -> Iterator[dict[str, str]]:
    with prefect_server(tmp_path_factory.mktemp("prefect-home"), prefect_database) as env:
        yield env


@pytest.fixture(scope="module")
def served(
    prefect_api: dict[str, str], tiny_raw: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """`ballast serve` on a work dir holding the tiny raw sample."""
    work = tmp_path_factory.mktemp("served")
    shutil.copytree(tiny_raw, work / "raw")
    log = (work / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "flows", "serve", "--work-dir", str(work)],
        env=prefect_api,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield prefect_api
    finally:
        stop_server(process)
        log.close()


async def wait_for_deployments(names: list[str], timeout_s: float = 120) -> dict:
    async with get_client() as client:
        for _ in range(int(timeout_s)):
            found = {}
            for name in names:
                try:
                    found[name] = await client.read_deployment_by_name(name)
                except Exception:  # not registered yet
                    break
            if len(found) == len(names):
                return found
            await asyncio.sleep(1)
    raise AssertionError(f"deployments {names} were not registered within {timeout_s} s")


async def wait_for_states(run_ids: list, timeout_s: float = 400) -> list[str]:
    async with get_client() as client:
        for _ in range(int(timeout_s / 2)):
            runs = [await client.read_flow_run(run_id) for run_id in run_ids]
            states = [run.state.type.value for run in runs]
            if all(state in TERMINAL for state in states):
                return states
            await asyncio.sleep(2)
    raise AssertionError(f"flow runs did not finish: {states}")


@pytest.mark.slow
def test_serve_registers_schedules_runs_nightly_and_cancels_an_overlap(served) -> None:
    """Invariants: every deployment is registered, the nightly one with its cron schedule and
    a concurrency limit of one; of two nightly runs started together one completes and the
    other is cancelled (CANCEL_NEW), so two nights never overlap."""
    with temporary_settings({PREFECT_API_URL: served["PREFECT_API_URL"]}):
        names = ["pipeline/nightly", "reshard/adhoc", "train/adhoc", "batch_inference/adhoc"]
        deployments = asyncio.run(wait_for_deployments(names))
        nightly = deployments["pipeline/nightly"]
        assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"]
        assert nightly.global_concurrency_limit.limit == 1
        runs = [run_deployment("pipeline/nightly", timeout=0, as_subflow=False) for _ in range(2)]
        states = asyncio.run(wait_for_states([run.id for run in runs]))
    assert sorted(states) == ["CANCELLED", "COMPLETED"]


@pytest.mark.slow
def test_served_deployments_show_named_parameter_sections(served) -> None:
    """Invariant: through the Prefect API, each served deployment's parameter schema has a
    named, described section per field of its flow's parameter model (the Parameters tab
    shows `reshard`, `dask`, `train`, ... by name, not one `params` blob), then the run's
    `overrides`; its parameters are the preset's under the same names, and the schema
    validates them (the UI's run form)."""
    from prefect.utilities.schema_tools import validate

    from flows.deployments import FLOWS

    with temporary_settings({PREFECT_API_URL: served["PREFECT_API_URL"]}):
        found = asyncio.run(
            wait_for_deployments(
                ["pipeline/nightly", "reshard/adhoc", "train/adhoc", "batch_inference/adhoc"]
            )
        )
    for name, deployment in found.items():
        fields = FLOWS[name.split("/")[0]][1].model_fields
        schema = deployment.parameter_openapi_schema
        assert list(schema["properties"]) == [*fields, "overrides"], name
        assert all(
            schema["properties"][field]["description"] for field in [*fields, "overrides"]
        ), name
        assert list(deployment.parameters) == list(fields) and "params" not in fields
        validate(deployment.parameters, schema, raise_on_error=True)
    nightly = found["pipeline/nightly"].parameters
    assert nightly["train"]["max_epochs"] >= 1 and nightly["reshard"]["dataset"]["inputs"]


async def scheduled_runs(deployment_id) -> int:
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    async with get_client() as client:
        runs = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
            ),
        )
    return len(runs)


async def wait_until_polled(name: str, timeout_s: float = 120) -> Any:
    """The deployment once a runner has polled it for runs (status READY): a serve stopped
    before its runner started exits without pausing anything."""
    async with get_client() as client:
        for _ in range(int(timeout_s)):
            deployment = await client.read_deployment_by_name(name)
            if deployment.status is not None and deployment.status.value == "READY":
                return deployment
            await asyncio.sleep(1)
    raise AssertionError(f"no runner polled {name} within {timeout_s} s")


@pytest.mark.slow
def test_stopping_serve_pauses_its_deployments_and_says_so(
    tmp_path: Path, prefect_database: Path
) -> None:
    """Invariants: once `ballast serve` is stopped (SIGTERM) the nightly deployment is paused
    with no scheduled runs left, and serve printed that, naming the deployments it served.
    Its own server: a runner serving the same deployments would mark them polled first."""
    (tmp_path / "home").mkdir()
    with prefect_server(tmp_path / "home", prefect_database) as prefect_api:
        output = stop_serve_after_it_polled(prefect_api, tmp_path)
    assert "paused the deployments it served (pipeline/nightly, reshard/adhoc" in output, output
    assert "removed their scheduled runs" in output


def stop_serve_after_it_polled(prefect_api: dict[str, str], work_dir: Path) -> str:
    """Start `ballast serve`, SIGTERM it once its runner polled, check what it left on the
    server; its output."""
    process = subprocess.Popen(
        [sys.executable, "-m", "flows", "serve", "--work-dir", str(work_dir)],
        env=prefect_api,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with temporary_settings({PREFECT_API_URL: prefect_api["PREFECT_API_URL"]}):
            asyncio.run(wait_for_deployments(["pipeline/nightly"]))
            nightly = asyncio.run(wait_until_polled("pipeline/nightly"))
            process.terminate()
            output, _ = process.communicate(timeout=60)
            assert asyncio.run(wait_for_deployments(["pipeline/nightly"]))[
                "pipeline/nightly"
            ].paused
            assert asyncio.run(scheduled_runs(nightly.id)) == 0
    finally:
        stop_server(process)
    return output
