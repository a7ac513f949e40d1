"""infra/prefect.yaml as a platform team uses it, with Prefect's own commands only: a real
`prefect server`, a process work pool, `prefect deploy --all` from the shipped file, a real
`prefect worker` started outside the checkout; then `ballast serve` on the same server."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.settings import PREFECT_API_URL, temporary_settings

from tests.services import free_port, prefect_env, start_prefect_server, stop_server

REPO = Path(__file__).resolve().parents[2]
NIGHTLY = "pipeline/nightly"


def prefect(env: dict[str, str], *args: str, check: bool = True) -> str:
    """A `prefect` CLI command in the checkout, non-interactive; its output (a failure,
    with `check`, shows it)."""
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0 or not check, (
        f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def worker_env(
    tiny_raw: Path, tmp_path_factory: pytest.TempPathFactory, prefect_database: Path
) -> Iterator[dict[str, str]]:
    """A server holding the shipped file's deployments on the process pool `ballast`, and a
    worker polling it from a directory outside the checkout, its BALLAST_WORK_DIR holding
    the tiny raw sample and MLFLOW_TRACKING_URI naming a store of its own (not the preset's
    `${WORK_DIR}/mlflow.db`); the environment that points at that server."""
    root = tmp_path_factory.mktemp("worker")
    shutil.copytree(tiny_raw, root / "work" / "raw")
    port = free_port()
    env = {
        **prefect_env(root / "home", port),
        "BALLAST_WORK_DIR": str(root / "work"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{root}/worker-mlflow.db",
    }
    server = start_prefect_server(env, port, database=prefect_database)
    worker = None
    try:
        prefect(env, "work-pool", "create", "ballast", "--type", "process")
        prefect(env, "deploy", "--all", "--prefect-file", "infra/prefect.yaml")
        with (root / "worker.log").open("wb") as log:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "prefect",
                    "worker",
                    "start",
                    "--pool",
                    "ballast",
                    "--type",
                    "process",
                ],
                env=env,
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        yield env
    finally:
        if worker is not None:
            stop_server(worker)
        stop_server(server)


def run_nightly(env: dict[str, str], overrides: str) -> FlowRun:
    """`prefect deployment run pipeline/nightly --param overrides=...` until the run ends
    (`--watch` exits 1 when the run failed: the run's state says why)."""
    output = prefect(
        env,
        "deployment",
        "run",
        NIGHTLY,
        "--param",
        f"overrides={overrides}",
        "--watch",
        "--watch-timeout",
        "800",
        check=False,
    )
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", output)
    assert run_id, output
    with (
        temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}),
        get_client(sync_client=True) as client,
    ):
        return client.read_flow_run(run_id.group(1))


def deployment_state(env: dict[str, str]) -> dict[str, Any]:
    """What `ballast serve` must leave alone: each deployment's pool, entrypoint, pull
    steps, paused flag, and the nightly's scheduled runs."""
    with (
        temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}),
        get_client(sync_client=True) as client,
    ):
        deployments = {
            name: client.read_deployment_by_name(name)
            for name in (NIGHTLY, "reshard/adhoc", "train/adhoc", "batch_inference/adhoc")
        }
        scheduled = client.read_flow_runs(
            deployment_filter=DeploymentFilter(
                id=DeploymentFilterId(any_=[deployments[NIGHTLY].id])
            ),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))
            ),
        )
    state: dict[str, Any] = {
        name: (found.work_pool_name, found.entrypoint, found.pull_steps, found.paused)
        for name, found in deployments.items()
    }
    state["scheduled"] = sorted(str(run.id) for run in scheduled)
    return state


@pytest.mark.slow
def test_worker_runs_the_shipped_file_with_one_overridden_field(worker_env) -> None:
    """Invariants: from the shipped infra/prefect.yaml, a process worker outside the
    checkout completes `pipeline/nightly` with `train.max_epochs=1` overridden (the MLflow
    run records 1, the preset says 4), tracked in the store the worker's
    MLFLOW_TRACKING_URI names, not in the preset's `${WORK_DIR}/mlflow.db`, as `ballast run`
    does. A bad override's failure is the quick tier's (tests/flows/test_overrides.py,
    through the method Prefect's engine calls)."""
    good = run_nightly(worker_env, '["train.max_epochs=1"]')
    assert good.state is not None and good.state.type == StateType.COMPLETED, good.state
    assert trained_epochs(worker_env["MLFLOW_TRACKING_URI"]) == {"1"}
    assert not (Path(worker_env["BALLAST_WORK_DIR"]) / "mlflow.db").exists()


def trained_epochs(tracking_uri: str) -> set[str]:
    """The `max_epochs` params of the nightly experiment's MLflow runs at `tracking_uri`."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("ballast-nightly")
    assert experiment is not None, f"the nightly run tracked nothing at {tracking_uri}"
    runs = client.search_runs([experiment.experiment_id])
    return {
        value
        for run in runs
        for key, value in run.data.params.items()
        if key.endswith("max_epochs")
    }


@pytest.mark.slow
def test_serve_leaves_the_worker_deployments_and_their_scheduled_runs(
    worker_env, tmp_path: Path
) -> None:
    """Invariants: `ballast serve` on a server holding the pool's deployments refuses,
    naming the deployment and its work pool, and afterwards every deployment keeps its
    pool, entrypoint, pull steps and unpaused schedule, the nightly its scheduled runs."""
    before = deployment_state(worker_env)
    assert before["scheduled"], "the server scheduled no nightly run to compare"
    serve = subprocess.run(
        [sys.executable, "-m", "flows", "serve", "--work-dir", str(tmp_path)],
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert serve.returncode != 0
    assert "pipeline/nightly (work pool 'ballast')" in serve.stderr, serve.stderr
    assert deployment_state(worker_env) == before
