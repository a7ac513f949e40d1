"""Dask workers as SLURM jobs (`dask.kind: slurm`) on a real SLURM cluster
(tests/slurm/conftest.py) when they do not come or go away: a refused worker job and one
that stays pending are errors with SLURM's reason, within the deadline; a step whose
worker job is cancelled under it fails naming the job and what SLURM said, instead of
waiting. A reshard on SLURM workers with a private /tmp runs in the whole pipeline's test
(test_slurm_pipeline.py)."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from distributed import Client

from preprocessing.contract.slurm import SubmissionRefused
from preprocessing.driver.cluster import dask_client
from preprocessing.driver.jobqueue import WorkersLost, WorkersNotReady
from tests.slurm.conftest import jobs_named, live_jobs, slurm_dask

pytest.importorskip("dask_jobqueue")
pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def test_a_refused_worker_job_is_an_error_naming_sbatchs_reason(shared_dir: Path) -> None:
    """Invariant: a partition SLURM does not have fails before any job is submitted, with
    sbatch's reason, instead of a reshard that waits forever."""
    dask = slurm_dask(shared_dir, jobs={"partition": "no-such-partition"})
    started = time.monotonic()
    with (
        pytest.raises(
            SubmissionRefused,
            match="sbatch refused the Dask worker jobs: Invalid partition name specified",
        ),
        dask_client(dask),
    ):
        pass
    assert time.monotonic() - started < 30


def test_workers_that_never_come_fail_at_the_deadline_naming_slurms_reason(
    shared_dir: Path,
) -> None:
    """Invariant: a worker job that stays pending fails the wait at `worker_timeout_s`,
    naming the job and SLURM's pending reason; the pending job is cancelled."""
    dask = slurm_dask(
        shared_dir, worker_timeout_s=5.0, jobs={"sbatch_options": ["--begin=now+3600"]}
    )
    with (
        pytest.raises(
            WorkersNotReady,
            match=r"no Dask worker joined in 5 s "
            r"\(dask.worker_timeout_s\): SLURM job \d+ \(PENDING: BeginTime",
        ),
        dask_client(dask),
    ):
        pass
    deadline = time.monotonic() + 60
    while live_jobs(dask.options["job_name"]) and time.monotonic() < deadline:
        time.sleep(1)
    assert live_jobs(dask.options["job_name"]) == []


def wait_on_a_task(client: Client) -> None:
    client.submit(time.sleep, 600, pure=False).result()


def wait_on_every_worker(client: Client) -> None:
    """As the step's worker checks do (`client.run`): fails at once when a worker goes."""
    client.run(time.sleep, 600)


@pytest.mark.parametrize("wait", [wait_on_a_task, wait_on_every_worker])
def test_a_step_whose_worker_job_is_cancelled_fails_naming_the_job(
    shared_dir: Path, wait: Callable[[Client], None]
) -> None:
    """Invariant: a Dask step whose only worker job is cancelled under it (as its walltime
    would end it), while it waits on a task or on a call to every worker, fails within
    seconds, not at `worker_timeout_s` nor never, naming the job, its SLURM state and
    slurmstepd's own line (not the closed connection the call saw)."""
    dask = slurm_dask(shared_dir, worker_timeout_s=300.0)
    started = time.monotonic()
    with pytest.raises(WorkersLost) as lost, dask_client(dask) as client:
        [job_id] = jobs_named(dask.options["job_name"])
        threading.Timer(1.0, subprocess.run, (["scancel", job_id],)).start()
        wait(client)
    assert time.monotonic() - started < 60
    assert re.search(
        rf"every Dask worker left and its job ended: SLURM job {job_id} \(CANCELLED; .*"
        rf"slurmstepd in \S+{job_id}\.err: \*\*\* JOB {job_id} ON \S+ CANCELLED AT ",
        str(lost.value),
    ), str(lost.value)
