"""The real one-host SLURM cluster of infra/slurm/local-cluster.sh (slurmctld and slurmd on
loopback, a private /tmp per job), started once a session if it is not up, and a directory
every job sees (this host's /var/tmp, as a shared file system would be: the jobs' /tmp is
their own). Tests skip, saying why, where SLURM cannot start (not installed, not root);
under CI (CI=true) they fail instead: CI installs and starts it (.ci/run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from preprocessing.contract.slurm import job_state
from preprocessing.driver.cluster import DaskConfig
from training.launch import RetryPolicy, SlurmJob

ROOT = Path(__file__).resolve().parents[2]
START_SCRIPT = ROOT / "infra" / "slurm" / "local-cluster.sh"
SHARED_BASE = Path("/var/tmp/ballast-slurm-tests")


def slurm_missing() -> str | None:
    """Why SLURM cannot run here, or None once its node is up (started if need be)."""
    if shutil.which("sbatch") is None or shutil.which("slurmctld") is None:
        return "slurm-wlm is not installed (apt-get install -y slurm-wlm munge, as root)"
    if node_is_up():
        return None
    if os.geteuid() != 0:
        return f"SLURM is not running and only root can start it ({START_SCRIPT})"
    started = subprocess.run(
        [str(START_SCRIPT)], capture_output=True, text=True, check=False, timeout=120
    )
    if started.returncode != 0 or not node_is_up():
        return f"{START_SCRIPT} failed: {started.stderr.strip()[-500:]}"
    return None


def node_is_up() -> bool:
    done = subprocess.run(
        ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, check=False, timeout=30
    )
    return done.returncode == 0 and any(
        state in done.stdout for state in ("idle", "mixed", "allocated")
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """A running SLURM cluster (skipped where none can start, failed in CI)."""
    reason = slurm_missing()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"SLURM must run in CI: {reason}")
    pytest.skip(f"no SLURM here: {reason}")


@pytest.fixture
def shared_dir(slurm_cluster: None) -> Iterator[Path]:
    """A directory of this test that every SLURM job sees (not /tmp: a job's is private)."""
    path = SHARED_BASE / uuid.uuid4().hex[:12]
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def jobs_named(name: str) -> list[str]:
    """The ids of the jobs SLURM knows (running or ended recently) named `name`."""
    done = subprocess.run(
        ["scontrol", "show", "job", "-o"], capture_output=True, text=True, check=False
    )
    return [
        line.split("JobId=", 1)[1].split()[0]
        for line in done.stdout.splitlines()
        if f" JobName={name} " in line
    ]


def live_jobs(name: str) -> list[str]:
    """The jobs named `name` that have not ended."""
    states = [job_state(job_id) for job_id in jobs_named(name)]
    return [state.job_id for state in states if state is not None and not state.ended]


def slurm_dask(shared: Path, **fields: Any) -> DaskConfig:
    """One single-threaded worker in one 1-CPU job, its log beside the test's files."""
    name = f"d-{uuid.uuid4().hex[:8]}"
    options = {
        "cores": 1,
        "processes": 1,
        "memory": "2GiB",
        "job_name": name,
        "log_directory": str(shared / "logs"),
        "local_directory": "/tmp",
    }
    settings = {"num_workers": 1, "worker_timeout_s": 120.0} | fields
    return DaskConfig(kind="slurm", options=options, **settings)


def slurm_job(attempts: int = 1, **fields: object) -> SlurmJob:
    """A job that asks for little (this host is shared): one CPU, a unique name."""
    settings: dict = {
        "num_processes_per_node": 2,
        "num_cpus_per_node": 1,
        "timeout_s": 300,
        "job_name": f"t-{uuid.uuid4().hex[:8]}",
        "retry": RetryPolicy(attempts=attempts, first_delay_s=0.5),
    }
    return SlurmJob(kind="slurm", **(settings | fields))
