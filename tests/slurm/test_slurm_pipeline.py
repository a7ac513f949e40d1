"""The whole pipeline on the real one-host SLURM (tests/slurm/conftest.py), as a user runs
it: `ballast run pipeline` with `dask.kind: slurm` (the reshard's Dask worker is a SLURM
job) and `job.kind: slurm` (training is a 2-rank sbatch job), on tiny data for one epoch.
The command runs as `.venv/bin/ballast` does without the venv on PATH, and its log file
(named to the Dask workers in `DASK_DISTRIBUTED__LOGGING`) is in this host's /tmp, which
no job sees (a private /tmp per job): the jobs run ballast's interpreter and nothing of the
host's /tmp reaches them. The run's record names its jobs, the champion is registered, no
job is left. Against the session's Prefect server: a temporary one would cost its start
and check nothing about SLURM."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
import yaml

from preprocessing.contract.manifest import read_manifest
from tests.cli_pipeline import pipeline_config
from tests.slurm.conftest import live_jobs, slurm_dask, slurm_job

pytest.importorskip("dask_jobqueue")
pytestmark = [pytest.mark.slow, pytest.mark.slurm]
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # sbatch's, not the venv's


def slurm_pipeline_config(raw: Path, shared: Path) -> dict[str, Any]:
    """One arm, one epoch, everything under `shared` (which every job sees), MLflow in a
    SQLite file there: the cheapest run that still registers a model."""
    config = pipeline_config(raw, shared / "work", f"sqlite:///{shared}/mlflow.db")
    return config | {
        "dask": slurm_dask(shared).model_dump(mode="json", exclude_defaults=True),
        "job": slurm_job(timeout_s=600).model_dump(mode="json", exclude_defaults=True),
        "compare_with_natural_mix": False,
    }


def ballast_off_path(command: list[str], log_dir: Path) -> subprocess.CompletedProcess[str]:
    """`ballast <command>` by the venv's interpreter with the venv off PATH, its log in
    `log_dir`, on the session's Prefect server."""
    from prefect.settings import PREFECT_API_URL

    env = {
        **{name: value for name, value in os.environ.items() if name != "VIRTUAL_ENV"},
        "PATH": SYSTEM_PATH,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "BALLAST_LOG_DIR": str(log_dir),
    }
    return subprocess.run(
        [sys.executable, "-m", "flows", *command],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_pipeline_runs_its_dask_step_and_training_as_slurm_jobs(
    prefect_harness: None, shared_dir: Path, tiny_raw: Path, tmp_path: Path
) -> None:
    """Invariants: `ballast run pipeline` with both Dask and training on SLURM, the venv off
    PATH and its log file in this host's /tmp, commits every input row, trains on 2 ranks
    and registers a champion; its log names the SLURM job the Dask worker ran as and the
    training job, whose output is under the run's output directory; no job is left in
    the queue afterwards (the Dask job ended with its step)."""
    raw = shutil.copytree(tiny_raw, shared_dir / "raw")
    config = slurm_pipeline_config(raw, shared_dir)
    dask_name, train_name = config["dask"]["options"]["job_name"], config["job"]["job_name"]
    (shared_dir / "pipeline.yaml").write_text(yaml.safe_dump(config))
    result_file = shared_dir / "result.json"
    command = ["run", "pipeline", "--config", str(shared_dir / "pipeline.yaml")]
    run = ballast_off_path([*command, "--result-file", str(result_file)], tmp_path / "logs")
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(result_file.read_text())
    manifest, _ = read_manifest(result["manifest_uri"])
    assert sum(split.num_rows for split in manifest.splits.values()) == (
        ds.dataset(str(raw)).count_rows()
    )
    assert result["training"]["world_size"] == 2
    assert result["registration"]["alias"] == "champion"
    [attempt] = result["training"]["attempts"]
    [log_file] = (tmp_path / "logs").glob("run-*.log")
    log = log_file.read_text()
    dask_jobs = re.findall(r"Dask workers joined from SLURM jobs (\d+)", log)
    assert dask_jobs and attempt["job_id"] not in dask_jobs
    run_folder = Path(result["training"]["output_dir"])  # <job>/runs/<flow run id>
    output = run_folder / "slurm" / f"{train_name}-{attempt['job_id']}.out"
    assert f"SLURM job {attempt['job_id']}, its output {output}" in log
    assert output.exists()
    deadline = time.monotonic() + 60  # the last step's worker job may still be ending
    while live_jobs(dask_name) + live_jobs(train_name) and time.monotonic() < deadline:
        time.sleep(1)
    assert live_jobs(dask_name) + live_jobs(train_name) == []
