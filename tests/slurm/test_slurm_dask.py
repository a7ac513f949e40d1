"""Dask workers as SLURM jobs (`dask.kind: slurm`) on a real SLURM cluster
(tests/slurm/conftest.py): a reshard whose workers run with a private /tmp while a
`ballast` command's worker log config (a file of this host's /tmp) is in the environment;
the jobs end with the step; a refused worker job and one that stays pending are errors
with SLURM's reason, within the deadline; a step whose worker job is cancelled under it
fails naming the job and what SLURM said, instead of waiting."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_manifest
from preprocessing.contract.slurm import SubmissionRefused
from preprocessing.driver.cluster import DaskConfig, dask_client
from preprocessing.driver.jobqueue import WorkersLost, WorkersNotReady
from preprocessing.driver.reshard import run_reshard
from tests.slurm.conftest import jobs_named, live_jobs

pytest.importorskip("dask_jobqueue")
pytestmark = [pytest.mark.slow, pytest.mark.slurm]


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


def worker_view(probe: str) -> dict[str, Any]:
    """On a worker: whether it sees the driver's /tmp file, and the leaked variable."""
    return {
        "sees_probe": os.path.exists(probe),
        "logging": os.environ.get("DASK_DISTRIBUTED__LOGGING"),
    }


def test_reshard_on_slurm_workers_with_a_private_tmp(
    shared_dir: Path, tiny_raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariants: with the worker log config of a `ballast` command (a file in this host's
    /tmp) in the environment, the SLURM worker starts (it sees neither the file nor the
    variable: its /tmp is private) and the reshard commits every input row; the worker
    job ends with the step (none is left for the next step to find gone)."""
    log_file = tmp_path / "run.log"
    monkeypatch.setenv(
        "DASK_DISTRIBUTED__LOGGING",
        repr(
            {
                "version": 1,
                "handlers": {"file": {"class": "logging.FileHandler", "filename": str(log_file)}},
                "root": {"handlers": ["file"]},
            }
        ),
    )
    raw = shutil.copytree(tiny_raw, shared_dir / "raw")
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(raw)]),
        output_root=str(shared_dir / "datasets"),
        target_shard_rows=1000,
    )
    dask = slurm_dask(shared_dir)
    with dask_client(dask) as client:
        assert list(client.run(worker_view, str(log_file)).values()) == [
            {"sees_probe": False, "logging": None}
        ]
        result = run_reshard(config, client)
    manifest, _ = read_manifest(result.manifest_uri)
    assert sum(split.num_rows for split in manifest.splits.values()) == (
        ds.dataset(str(raw)).count_rows()
    )
    deadline = time.monotonic() + 60
    while live_jobs(dask.options["job_name"]) and time.monotonic() < deadline:
        time.sleep(1)
    assert live_jobs(dask.options["job_name"]) == []


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


def test_a_step_whose_worker_job_is_cancelled_fails_naming_the_job(shared_dir: Path) -> None:
    """Invariant: a Dask step whose only worker job is cancelled under it (as its walltime
    would end it) fails within seconds, not at `worker_timeout_s` nor never, naming the
    job, its SLURM state and slurmstepd's own line; the task it waited for is not run."""
    dask = slurm_dask(shared_dir, worker_timeout_s=300.0)
    started = time.monotonic()
    with pytest.raises(WorkersLost) as lost, dask_client(dask) as client:
        [job_id] = jobs_named(dask.options["job_name"])
        waiting = client.submit(time.sleep, 600, pure=False)
        subprocess.run(["scancel", job_id], check=True)
        waiting.result()
    assert time.monotonic() - started < 60
    assert re.search(
        rf"every Dask worker left and its job ended: SLURM job {job_id} \(CANCELLED; .*"
        rf"slurmstepd in \S+{job_id}\.err: \*\*\* JOB {job_id} ON \S+ CANCELLED AT ",
        str(lost.value),
    ), str(lost.value)
