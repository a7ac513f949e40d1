"""Run a training job: pin what every attempt shares, then attempt under one retry policy.

    summary = run_job(train_config, LaunchConfig(kind="slurm", num_nodes=4, ...))

`pin_job` fixes, once per job, what every rank of every attempt must agree on and
writes it to `<output_dir>/train-config.pinned.yaml`:
- the dataset version: `_CURRENT` is resolved once to the version's manifest URI,
  so a version committed while the job starts, or between attempts, changes nothing;
- the MLflow run: created now, with its lineage, when the config names none, so
  every attempt logs into one run, and a fresh sqlite store is made before ranks
  race on it (docs/architecture.md M6);
- the tracking credentials: a password in the tracking URI moves into the ranks'
  environment (MLFLOW_TRACKING_USERNAME/PASSWORD, which MLflow reads), so no
  config written to disk holds it.

`run_job` is the one place a job is retried and the one place that decides to
resume: the first attempt resumes only if the config says so, every retry resumes
from the last checkpoint (docs/architecture.md M7), and a retry that finds none
says so (the failed attempt ended before its first save: the retry starts from
scratch, and its attempt record shows `resumed_from: null`). A config or data
error that a rank reports fails the job at once (training/launch/failures.py). A
`multinode` launch is one attempt (training/launch/config.py): its nodes are
relaunched together by whoever started them, never each by its own loop.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from fsspec.core import url_to_fs

from preprocessing.contract.manifest import MANIFEST_NAME, Manifest, read_manifest
from preprocessing.toolbox.faults import backoff_s
from preprocessing.toolbox.secrets import split_credentials
from tracking.config import TrackingConfig
from training.config import TrainConfig, dump_train_config
from training.distributed.hangs import take_hang_reports
from training.launch.config import AnyJob, MultiNodeJob, job_retry
from training.launch.failures import TrainingFailed, clear_error_logs, read_config_errors
from training.launch.kubernetes import KubernetesLauncher
from training.launch.launchers import Launcher, LocalTorchrunLauncher, MultiNodeTorchrunLauncher
from training.launch.processes import read_tail
from training.launch.slurm import SlurmLauncher
from training.summary import read_summary

PINNED_CONFIG_NAME = "train-config.pinned.yaml"
LAUNCHERS: dict[str, type[Launcher[Any]]] = {
    "local": LocalTorchrunLauncher,
    "multinode": MultiNodeTorchrunLauncher,
    "slurm": SlurmLauncher,
    "kubernetes": KubernetesLauncher,
}
ERROR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class PinnedJob:
    """The config every attempt runs (as written at `config_uri`) and the secrets its
    ranks get in their environment."""

    config: TrainConfig
    config_uri: str
    secret_env: dict[str, str]


def make_launcher(spec: AnyJob) -> Launcher[Any]:
    """The launcher of `spec.kind`."""
    return LAUNCHERS[spec.kind](spec)


def run_job(cfg: TrainConfig, job: AnyJob) -> dict[str, Any]:
    """Pin the job, run it, retry it under `job_retry(job)`; its summary.json, plus
    `attempts` (status, resume, checkpoint resumed from, seconds, end time and error of
    each), `run_id` and `manifest_uri`."""
    pinned = pin_job(cfg, job)
    launcher, policy = make_launcher(job), job_retry(job)
    attempts: list[dict[str, Any]] = []
    for attempt in range(1, policy.attempts + 1):
        resume = cfg.resume or attempt > 1  # the one place that decides to resume
        started, resumed_from = time.monotonic(), checkpoint_to_resume(pinned, resume, attempt)
        try:
            summary = run_attempt(launcher, pinned, resume)
        except TrainingFailed as failure:
            attempts.append(attempt_record(started, launcher, resume, resumed_from, failure))
            if failure.config_error is not None or attempt == policy.attempts:
                failure.attempts = attempts
                fail_job_run(pinned, failure)
                raise
            time.sleep(backoff_s(policy, attempt))
            continue
        attempts.append(attempt_record(started, launcher, resume, resumed_from))
        tracking = pinned.config.tracking
        return summary | {
            "attempts": attempts,
            "manifest_uri": pinned.config.dataset,
            "run_id": tracking.run_id if tracking else None,
        }
    raise AssertionError("unreachable: the last attempt returns or raises")


def run_attempt(launcher: Launcher, pinned: PinnedJob, resume: bool) -> dict[str, Any]:
    """One attempt: the summary rank 0 wrote, or TrainingFailed naming why there is none."""
    output_dir = pinned.config.output_dir
    clear_error_logs(output_dir)
    with tempfile.TemporaryFile() as log:
        returncode = launcher.run(pinned.config_uri, resume, pinned.secret_env, log)
        tail = read_tail(log)
    if returncode == 0:
        return read_summary(output_dir)
    causes = read_config_errors(output_dir)
    if causes:
        ranks = f" on {len(causes)} ranks" if len(causes) > 1 else ""
        raise TrainingFailed(
            f"training stopped on a config or data error{ranks}",
            returncode,
            tail,
            config_error=causes[0],
        )
    hangs = take_hang_reports(output_dir)  # a hang is retried, unlike a config error
    if hangs:
        raise TrainingFailed(f"training hung: {hangs[0]}", returncode, tail)
    where = launcher.describe_attempt()
    if returncode is None:
        raise TrainingFailed(
            f"training timed out after {launcher.spec.timeout_s} s{where}", None, tail
        )
    raise TrainingFailed(f"training exited with status {returncode}{where}", returncode, tail)


def fail_job_run(pinned: PinnedJob, failure: TrainingFailed) -> None:
    """Close the job's MLflow run FAILED with the cause: no retry follows."""
    tracking = pinned.config.tracking
    if tracking is not None and tracking.run_id is not None:
        from tracking.run.runs import fail_run

        cause = failure.config_error or failure.output_tail[-ERROR_TAIL_CHARS:]
        try:
            fail_run(tracking, tracking.run_id, f"{failure.message}: {cause}")
        except Exception as error:  # the job's own failure is what the caller must see
            failure.add_note(f"(its MLflow run could not be marked failed: {error})")


def checkpoint_to_resume(pinned: PinnedJob, resume: bool, attempt: int) -> str | None:
    """The checkpoint a resuming attempt starts from, or None; a retry that finds none
    says so, rather than starting from scratch without a word."""
    if not resume:
        return None
    uri = pinned.config.last_checkpoint_uri
    fs, path = url_to_fs(uri)
    if fs.exists(path):
        return uri
    if attempt > 1:
        print(
            f"retry {attempt - 1}: no checkpoint at {uri} (the failed attempt ended before "
            "its first save): this attempt trains from scratch",
            file=sys.stderr,
        )
    return None


def attempt_record(
    started: float,
    launcher: Launcher,
    resume: bool,
    resumed_from: str | None,
    failure: TrainingFailed | None = None,
) -> dict[str, Any]:
    """What `attempts` keeps of one attempt (an error as its cause or its output's tail;
    the batch job's id where it ran as one)."""
    record: dict[str, Any] = {
        "returncode": 0 if failure is None else failure.returncode,
        "resume": resume,
        "resumed_from": resumed_from,
        "elapsed_s": round(time.monotonic() - started, 3),
        "ended_at": time.time(),
    }
    if launcher.job_id is not None:
        record["job_id"] = launcher.job_id
    if failure is not None:
        record["cause"] = str(failure).split("\n", 1)[0]  # e.g. which rank hung
        record["error"] = failure.config_error or failure.output_tail[-ERROR_TAIL_CHARS:]
    return record


def pin_job(cfg: TrainConfig, job: AnyJob) -> PinnedJob:
    """Resolve the dataset version, open the MLflow run, take the credentials out of the
    tracking URI; write the result where every node reads it (see the module)."""
    if isinstance(job, MultiNodeJob):
        check_pinned_for_nodes(cfg)
    manifest, manifest_uri = read_manifest(cfg.dataset)
    pinned = cfg.model_copy(update={"dataset": manifest_uri})
    secret_env: dict[str, str] = {}
    if cfg.tracking is not None:
        tracking, secret_env = pin_tracking(pinned, cfg.tracking, manifest, job)
        pinned = pinned.model_copy(update={"tracking": tracking})
    uri = dump_train_config(pinned, f"{cfg.output_dir.rstrip('/')}/{PINNED_CONFIG_NAME}")
    return PinnedJob(pinned, uri, secret_env)


def pin_tracking(
    cfg: TrainConfig, tracking: TrackingConfig, manifest: Manifest, job: AnyJob
) -> tuple[TrackingConfig, dict[str, str]]:
    """The job's run (opened now if the config names none) and a tracking URI without
    credentials, with the environment that carries them to the ranks."""
    run_id = tracking.run_id or open_job_run(cfg, tracking, manifest, job)
    uri, username, password = split_credentials(tracking.tracking_uri)
    env = (
        {}
        if password is None
        else {"MLFLOW_TRACKING_USERNAME": username or "", "MLFLOW_TRACKING_PASSWORD": password}
    )
    return tracking.model_copy(update={"run_id": run_id, "tracking_uri": uri}), env


def open_job_run(
    cfg: TrainConfig, tracking: TrackingConfig, manifest: Manifest, job: AnyJob
) -> str:
    """Create the job's MLflow run with its params, tags and dataset lineage (the pinned
    version) before any rank starts."""
    from tracking.run.runs import start_run

    params = {
        "train": cfg.model_dump(mode="json", exclude={"tracking"}),
        "dataset": manifest.config,
        "num_processes": job.world_size,
    }
    tags = {"ballast.strategy": cfg.strategy, "ballast.world_size": str(job.world_size)}
    return start_run(tracking, manifest, cfg.dataset, params, tags)


def check_pinned_for_nodes(cfg: TrainConfig) -> None:
    """Each node of a multinode job pins on its own: they agree only if the config names
    the version and the run already (e.g. a `train-config.pinned.yaml` of a local pin)."""
    if not cfg.dataset.rstrip("/").endswith(MANIFEST_NAME):
        raise ValueError(
            f"dataset: a multinode job needs a version's {MANIFEST_NAME} URI, not "
            f"{cfg.dataset}: every node must read the same version"
        )
    if cfg.tracking is not None and cfg.tracking.run_id is None:
        raise ValueError(
            "tracking.run_id: a multinode job needs its run created beforehand "
            "(every node must log into one run)"
        )
