"""Training jobs on a real SLURM cluster (tests/slurm/conftest.py), submitted as
`kind: slurm` submits them: every way a job goes wrong said with its cause: the wrong
Python (job id, output file and its last line in the error), a timeout (the job cancelled
and ended before the retry, which meets on another port), SIGTERM of the launcher (the job
cancelled before it exits), a refused submission (never retried) and a walltime. A 2-rank
job that runs ballast's interpreter with the venv off PATH is the training of the whole
pipeline's test (test_slurm_pipeline.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from preprocessing.contract.slurm import job_state
from tests.slurm.conftest import jobs_named, live_jobs, slurm_job
from tests.training.conftest import write_dataset
from training.config import LoaderConfig, TrainConfig, dump_train_config
from training.launch import TrainingFailed, run_job
from training.launch.processes import child_env

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def train_config(shared: Path) -> TrainConfig:
    root = write_dataset(shared / "data", 256, holdout_rows=64, num_shards=2, row_group_size=32)
    return TrainConfig(
        dataset=root,
        output_dir=str(shared / "run"),
        max_epochs=1,
        process_group_timeout_s=120,
        loader=LoaderConfig(batch_size=32, num_workers=0),
    )


def sleeping_python(shared: Path) -> str:
    """A "python" that never starts training: the job runs until it is stopped."""
    script = shared / "sleeping-python"
    script.write_text("#!/bin/sh\nexec sleep 600\n")
    script.chmod(0o755)
    return str(script)


def test_wrong_python_fails_naming_the_job_its_output_and_the_cause(shared_dir: Path) -> None:
    """Invariant: a job whose Python lacks torch fails with the job id, its state, the
    path of its output file and that file's last line (the ModuleNotFoundError) in the
    error's first line, which the console, the run log and MLflow show."""
    job = slurm_job(python="/usr/bin/python3")
    with pytest.raises(TrainingFailed) as failed:
        run_job(train_config(shared_dir), job, run_key="no-module")
    [job_id] = jobs_named(job.job_name)
    output = shared_dir / "run" / "runs" / "no-module" / "slurm" / f"{job.job_name}-{job_id}.out"
    first_line = str(failed.value).split("\n", 1)[0]
    assert re.search(
        rf"training exited with status 1 in SLURM job {job_id} \(FAILED, exit "
        rf"code 1; its output: {re.escape(str(output))}\), ending: .*No module "
        r"named 'torch'",
        first_line,
    ), first_line


def test_timeout_cancels_the_job_and_waits_for_its_end_before_the_retry(shared_dir: Path) -> None:
    """Invariants: an attempt that times out is cancelled, and SLURM reports it ended
    before the retry is submitted (the two jobs never run at once); the retry's job is
    another job (another rendezvous port, derived from its id); nothing is left running."""
    job = slurm_job(attempts=2, timeout_s=6, python=sleeping_python(shared_dir))
    with pytest.raises(
        TrainingFailed,
        match=r"timed out after 6\.0 s in SLURM job \d+ "
        r"\(CANCELLED",
    ):
        run_job(train_config(shared_dir), job)
    first, second = sorted(jobs_named(job.job_name), key=int)
    ended, started = job_field(first, "EndTime"), job_field(second, "StartTime")
    assert ended <= started, (ended, started)
    assert live_jobs(job.job_name) == []


def test_a_refused_submission_is_not_retried_and_names_sbatchs_reason(shared_dir: Path) -> None:
    """Invariant: a partition SLURM does not have fails the job at once, not retried,
    with sbatch's reason; no job exists."""
    job = slurm_job(attempts=3, partition="no-such-partition")
    with pytest.raises(
        TrainingFailed,
        match=r"sbatch refused the training job t-\w+: Invalid "
        "partition name specified",
    ) as failed:
        run_job(train_config(shared_dir), job)
    assert failed.value.config_error is not None and len(failed.value.attempts) == 1
    assert jobs_named(job.job_name) == []


def test_a_job_past_its_walltime_fails_naming_the_time_limit(shared_dir: Path) -> None:
    """Invariant: a job SLURM ends at its time limit fails with state TIMEOUT and the
    limit named (SLURM counts limits in minutes: the shortest is one)."""
    job = slurm_job(time_limit="00:01:00", python=sleeping_python(shared_dir))
    with pytest.raises(
        TrainingFailed,
        match=r"in SLURM job \d+ \(TIMEOUT: it reached its "
        r"time limit of 00:01:00",
    ):
        run_job(train_config(shared_dir), job)
    assert live_jobs(job.job_name) == []


def test_sigterm_of_the_launcher_cancels_its_job_before_it_exits(shared_dir: Path) -> None:
    """Invariant: `python -m training.launch launch` stopped by SIGTERM while its job runs
    cancels the job and exits only once SLURM reports it ended."""
    config = dump_train_config(train_config(shared_dir), shared_dir / "train.yaml")
    name = f"t-{uuid.uuid4().hex[:8]}"
    launch = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training.launch",
            "launch",
            "--config",
            config,
            "--kind",
            "slurm",
            "--python",
            sleeping_python(shared_dir),
            "--num-cpus-per-node",
            "1",
            "--attempts",
            "1",
            "--job-name",
            name,
        ],
        env=child_env(),
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not live_jobs(name) and time.monotonic() < deadline and launch.poll() is None:
        time.sleep(0.5)
    assert live_jobs(name), "the job never started"
    launch.send_signal(signal.SIGTERM)
    assert launch.wait(timeout=120) == 128 + signal.SIGTERM
    [job_id] = jobs_named(name)
    state = job_state(job_id)
    assert state is not None and state.state == "CANCELLED"


def job_field(job_id: str, field: str) -> str:
    """One field of `scontrol show job` (ISO times compare as strings)."""
    state = job_state(job_id)
    assert state is not None, f"SLURM forgot job {job_id}"
    done = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True
    )
    return re.search(rf"\b{field}=(\S+)", done.stdout).group(1)  # type: ignore[union-attr]
