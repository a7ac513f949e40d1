"""Training nights of the soak (tests/soak/chain.py): the night's pipeline under a fault that
lands in training or tracking, then the tracking invariants besides the data ones.

A training night uploads the night's inputs as a data night does, then runs the whole
`pipeline` flow (`python -m flows run pipeline`: the incremental reshard of the chain,
1 epoch of 2-rank DDP on the tiny version, evaluation, registration) against the soak's
own Prefect and MLflow servers (started at the first training night, restartable on
their ports), with one fault after a random delay within the pipeline's expected
duration:

- `rank_kill`: SIGKILL of one torchrun rank as soon as the job's first mid-epoch
  checkpoint is saved (the launcher's retry resumes from it; the night's note says
  how many attempts the job took and what the last one resumed from);
- `mlflow_restart`: the MLflow server stopped and started again on its port and store;
- `prefect_restart`: the Prefect server stopped and started again on its port and home.

A pipeline that fails is rerun without faults and must succeed. After the night: the data
checks of chain.check_night; `python -m tracking upload` of the runs kept in their spools
while MLflow was down (what a person runs after an outage); then every MLflow run of the
soak's experiment is FINISHED, or FAILED with a reason (`ballast.failure_reason`), none
left RUNNING, and no training run has two registered versions of the model.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml
from mlflow.entities import ViewType
from mlflow.tracking import MlflowClient

from tests.services import (
    free_port,
    prefect_env,
    start_mlflow_server,
    start_prefect_server,
    stop_server,
)
from tests.soak.chain import add_inputs, check_night, finish
from tests.soak.soak_state import REPO, Night, Soak, config_for
from tracking.run.runs import FAILURE_TAG

TRAINING_KINDS = ("rank_kill", "mlflow_restart", "prefect_restart")
EXPERIMENT, MODEL = "soak", "soak-clf"
PIPELINE_TIMEOUT_S = 600
# A server restarted on a loaded host took 110 s to answer (more than the suite's waits).
SERVER_START_S = 600


@dataclass
class Services:
    """The soak's MLflow and Prefect servers, each restartable on its port and store."""

    work: Path
    mlflow_port: int
    prefect_port: int
    mlflow: subprocess.Popen
    prefect: subprocess.Popen
    expected_s: float = 120.0  # the last clean pipeline's duration: faults land within it
    job_dir: Path | None = None  # the running pipeline's training output

    @classmethod
    def start(cls, work: Path) -> Services:
        work.mkdir(parents=True, exist_ok=True)
        mlflow_port, prefect_port = free_port(), free_port()
        mlflow = start_mlflow_server(work, mlflow_port, timeout_s=SERVER_START_S)
        prefect = start_prefect_server(
            prefect_env(work / "prefect", prefect_port), prefect_port, SERVER_START_S
        )
        return cls(work, mlflow_port, prefect_port, mlflow, prefect)

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def prefect_env(self) -> dict[str, str]:
        return prefect_env(self.work / "prefect", self.prefect_port)

    def restart_mlflow(self) -> None:
        stop_server(self.mlflow)
        self.mlflow = start_mlflow_server(self.work, self.mlflow_port, timeout_s=SERVER_START_S)

    def restart_prefect(self) -> None:
        stop_server(self.prefect)
        self.prefect = start_prefect_server(self.prefect_env, self.prefect_port, SERVER_START_S)

    def stop(self) -> None:
        for server in (self.mlflow, self.prefect):
            stop_server(server)


def services_of(soak: Soak) -> Services:
    """The soak's servers, started at its first training night."""
    if soak.services is None:
        soak.services = Services.start(soak.work / "services")
    services: Services = soak.services
    return services


def pipeline_file(soak: Soak, services: Services, name: str) -> Path:
    """The pipeline's config: the chain's reshard, 1 epoch on 2 ranks, tracked and
    registered; checkpoints every 5 steps so a retry resumes mid-epoch."""
    job_dir = services.job_dir = soak.work / "jobs" / name
    config = {
        "reshard": config_for(soak, soak.root).model_dump(mode="json"),
        "dask": {"kind": "local", "num_workers": 2},
        "train": {
            "dataset": str(soak.root),
            "output_dir": str(job_dir),
            "max_epochs": 1,
            "checkpoint_every_n_steps": 5,
            "loader": {"batch_size": 16},
            "tracking": {
                "tracking_uri": services.tracking_uri,
                "experiment": EXPERIMENT,
                "registered_model_name": MODEL,
                "spool_dir": str(soak.work / "spool"),
            },
        },
        "job": {
            "kind": "local",
            "num_processes_per_node": 2,
            "timeout_s": PIPELINE_TIMEOUT_S,
            "retry": {"attempts": 2, "first_delay_s": 1.0, "max_delay_s": 5.0},
        },
    }
    path = soak.work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_pipeline(soak: Soak, services: Services, name: str, endpoint: str) -> subprocess.Popen:
    """`python -m flows run pipeline` of this checkout in its own session, S3 at `endpoint`."""
    search = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**services.prefect_env, "PYTHONPATH": search, "AWS_ENDPOINT_URL": endpoint}
    logs = soak.work / "logs"
    logs.mkdir(exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "flows",
        "run",
        "pipeline",
        "--config",
        str(pipeline_file(soak, services, name)),
        "--output",
        "json",
    ]
    with open(logs / f"{name}.out", "w") as out, open(logs / f"{name}.err", "w") as err:
        return subprocess.Popen(command, start_new_session=True, stdout=out, stderr=err, env=env)


def ranks(process: subprocess.Popen) -> list[psutil.Process]:
    """The training ranks of the pipeline: the children of its torchrun."""
    with contextlib.suppress(psutil.Error):
        tree = psutil.Process(process.pid).children(recursive=True)
        runs = [p for p in tree if "torch.distributed.run" in " ".join(_cmdline(p))]
        return [child for run in runs for child in run.children()]
    return []


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def kill_rank(soak: Soak, process: subprocess.Popen, rng: np.random.Generator) -> bool:
    """SIGKILL one rank as soon as the job's first checkpoint is saved (polled until the
    pipeline ends); whether one was killed."""
    job_dir = services_of(soak).job_dir
    assert job_dir is not None
    found: list[psutil.Process] = []
    while process.poll() is None and not found:
        time.sleep(0.02)
        saved = any(job_dir.glob("runs/*/checkpoints/last.ckpt"))  # the run's own folder
        found = ranks(process) if saved else []
    if not found:
        return False
    victim = found[int(rng.integers(len(found)))]
    with contextlib.suppress(psutil.Error):
        victim.kill()
        return True
    return False


def restart(which: str) -> Any:
    def inject(soak: Soak, process: subprocess.Popen, rng: np.random.Generator) -> bool:
        if process.poll() is not None:
            return False
        getattr(services_of(soak), f"restart_{which}")()
        return True

    return inject


INJECT = {
    "rank_kill": kill_rank,
    "mlflow_restart": restart("mlflow"),
    "prefect_restart": restart("prefect"),
}


def faulted_pipeline(
    soak: Soak, night: int, kind: str, rng: np.random.Generator
) -> tuple[int, bool]:
    """The night's pipeline with its fault after a random delay; (exit status, landed)."""
    services = services_of(soak)
    process = start_pipeline(soak, services, f"night-{night:03d}", soak.proxy.url)
    landed: list[bool] = []
    # A rank is killed at the first checkpoint: it watches from the start.
    delay = 0.0 if kind == "rank_kill" else float(rng.uniform(0.1, 0.7)) * services.expected_s
    fault = threading.Timer(delay, lambda: landed.append(INJECT[kind](soak, process, rng)))
    fault.start()
    code = finish(process, PIPELINE_TIMEOUT_S)
    fault.cancel()
    fault.join()
    return code, bool(landed and landed[0])


def clean_pipeline(soak: Soak, name: str) -> None:
    """A pipeline without faults (straight to moto) that must succeed; it times the next."""
    services = services_of(soak)
    began = time.monotonic()
    code = finish(start_pipeline(soak, services, name, soak.moto_url), PIPELINE_TIMEOUT_S)
    services.expected_s = time.monotonic() - began
    if code != 0:
        err = (soak.work / "logs" / f"{name}.err").read_text()[-3000:]
        raise AssertionError(f"{name}: pipeline exit status {code}, expected success:\n{err}")


def deliver_spools(soak: Soak, night: int) -> None:
    """`python -m tracking upload` of every run spool, as a person would after an outage:
    what the server could not take during the night reaches it (a spool already sent
    sends nothing twice)."""
    spools = sorted(str(path) for path in (soak.work / "spool").glob("*") if path.is_dir())
    if not spools:
        return
    search = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "tracking", "upload", *spools, "--wait-s", "30"],
        env={**os.environ, "PYTHONPATH": search},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"night {night}: tracking upload:\n{done.stderr[-3000:]}"


def check_tracking(soak: Soak, night: int) -> None:
    """Every run of the soak's experiment is FINISHED, or FAILED with a reason; no training
    run has two registered versions of the model (AssertionError naming what broke)."""
    client = MlflowClient(services_of(soak).tracking_uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert experiment is not None, f"night {night}: no MLflow experiment {EXPERIMENT!r}"
    runs = client.search_runs(
        [experiment.experiment_id], run_view_type=ViewType.ALL, max_results=10_000
    )
    for run in runs:
        status, reason = run.info.status, run.data.tags.get(FAILURE_TAG, "")
        assert status == "FINISHED" or (status == "FAILED" and reason), (
            f"night {night}: MLflow run {run.info.run_id} ({run.info.run_name}) is {status}"
            f"{'' if status != 'FAILED' else ' without a ' + FAILURE_TAG}"
        )
    versions = client.search_model_versions(f"name='{MODEL}'")
    twice = {run: n for run, n in Counter(v.run_id for v in versions).items() if n > 1}
    assert not twice, f"night {night}: runs with more than one version of {MODEL}: {twice}"
    assert versions, f"night {night}: no version of {MODEL} registered"


def training_night(soak: Soak, night: int, kind: str, rng: np.random.Generator) -> Night:
    """One training night: inputs, the faulted pipeline (rerun clean if it failed), then
    the data checks and the tracking checks."""
    started = time.monotonic()
    how = add_inputs(soak, night, rng)
    code, landed = faulted_pipeline(soak, night, kind, rng)
    if code != 0:
        clean_pipeline(soak, f"rerun-{night:03d}")
    lost = check_night(soak, night)
    deliver_spools(soak, night)
    check_tracking(soak, night)
    return Night(
        night,
        kind,
        landed,
        code != 0,
        f"{how}; {attempts(soak, f'night-{night:03d}')}",
        time.monotonic() - started,
        lost,
    )


def attempts(soak: Soak, name: str) -> str:
    """How many attempts the job of pipeline `name` took and what its last resumed from
    (from the pipeline's JSON result)."""
    with contextlib.suppress(OSError, ValueError):
        result = json.loads((soak.work / "logs" / f"{name}.out").read_text())
        tries = result["training"]["attempts"]
        resumed = tries[-1].get("resumed_from")
        return f"job: {len(tries)} attempts" + (
            f", resumed from {Path(resumed).name}" if resumed else ""
        )
    return f"{name}: no result"


TRAINING_NIGHTS = dict.fromkeys(TRAINING_KINDS, training_night)
