"""Run a training job: pin what every attempt shares, then attempt under one retry policy.

    summary = run_job(train_config, LaunchConfig(kind="slurm", num_nodes=4, ...))

`pin_job` fixes, once per job, what every rank of every attempt must agree on and
writes it to `<output_dir>/runs/<run_key>/train-config.pinned.yaml`:
- the run's own folders: output_dir and checkpoint_dir become `<dir>/runs/<run_key>`
  (the Prefect flow run id under a flow, else a generated id), so two jobs started at
  once on one work dir share no config, checkpoint, summary or plot, and a retry of the
  same run (same key) resumes its own checkpoint, never another's unless named
  (`resume_from_run`);
- the dataset version: `_CURRENT` is resolved once to the version's manifest URI,
  so a version committed while the job starts, or between attempts, changes nothing;
- the MLflow run: created now, with its lineage, when the config names none, so
  every attempt logs into one run, and a fresh sqlite store is made before ranks
  race on it (docs/architecture.md M6);
- the tracking credentials: a password in the tracking URI moves into the ranks'
  environment (MLFLOW_TRACKING_USERNAME/PASSWORD, which MLflow reads), so no
  config written to disk holds it.

Lineage is true by construction: the run's `train.*` params are read back from the
pinned file once written, its sha256 is the run's tag `ballast.config_sha256`, and
every rank records the sha256 of the file it read in its summary; `run_job` refuses a
summary whose hash is not the pinned file's.

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

import hashlib
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

import yaml
from fsspec.core import url_to_fs

from preprocessing.contract.manifest import MANIFEST_NAME, Manifest, read_manifest
from preprocessing.toolbox.faults import backoff_s
from preprocessing.toolbox.secrets import split_credentials
from tracking.config import TrackingConfig
from training.config import TrainConfig, check_selection_split, config_sha256, dump_train_config
from training.distributed.hangs import take_hang_reports
from training.launch.config import AnyJob, MultiNodeJob, job_retry
from training.launch.failures import TrainingFailed, clear_error_logs, read_config_errors
from training.launch.kubernetes import KubernetesLauncher
from training.launch.launchers import Launcher, LocalTorchrunLauncher, MultiNodeTorchrunLauncher
from training.launch.processes import read_tail
from training.launch.slurm import SlurmLauncher
from training.summary import CHOSEN_ON_TAG, read_summary

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
    sha256: str = ""  # of the file at config_uri


def make_launcher(spec: AnyJob) -> Launcher[Any]:
    """The launcher of `spec.kind`."""
    return LAUNCHERS[spec.kind](spec)


def run_job(cfg: TrainConfig, job: AnyJob, run_key: str | None = None) -> dict[str, Any]:
    """Pin the job as run `run_key` (None: a new id), run it, retry it under
    `job_retry(job)`; its summary.json, plus `attempts` (status, resume, checkpoint
    resumed from, seconds, end time and error of each), `run_id`, `manifest_uri`, the
    run's `run_key`, `output_dir` and `checkpoint_uri`."""
    pinned = pin_job(cfg, job, run_key)
    launcher, policy = make_launcher(job), job_retry(job)
    attempts: list[dict[str, Any]] = []
    rerun = _exists(pinned.config.last_checkpoint_uri)  # the same run started again
    for attempt in range(1, policy.attempts + 1):
        resume = cfg.resume or rerun or attempt > 1  # the one place that decides to resume
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
        return summary | ran(pinned, summary) | {"attempts": attempts}
    raise AssertionError("unreachable: the last attempt returns or raises")


def ran(pinned: PinnedJob, summary: dict[str, Any]) -> dict[str, Any]:
    """What the job ran, for its result: the run, its folders, the version, the config's
    sha256, checked against the one rank 0 read (a different file ran: refused)."""
    if summary.get("config_sha256") != pinned.sha256:
        raise TrainingFailed(
            f"{pinned.config_uri}: the ranks ran a config of sha256 "
            f"{summary.get('config_sha256')}, not the pinned one ({pinned.sha256})",
            None,
            "",
        )
    tracking, config = pinned.config.tracking, pinned.config
    return {
        "manifest_uri": config.dataset,
        "run_id": tracking.run_id if tracking else None,
        "run_key": config.run_key,
        "output_dir": config.output_dir,
        "checkpoint_uri": config.checkpoint_uri,
        "config_uri": pinned.config_uri,
    }


def _exists(uri: str) -> bool:
    fs, path = url_to_fs(uri)
    return bool(fs.exists(path))


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
    candidates = pinned.config.resume_candidates
    found = next((uri for uri in candidates if _exists(uri)), None)
    if found is not None:
        return found
    if attempt > 1:
        print(
            f"retry {attempt - 1}: no checkpoint at {candidates[0]} (the failed attempt "
            "ended before its first save): this attempt trains from scratch",
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


def new_run_key() -> str:
    """A run's folder name when no flow run names it: sortable by start, never repeated."""
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def nodes_key(cfg: TrainConfig, job: AnyJob) -> str | None:
    """The run key every node of a multinode job derives alike: its MLflow run's id, or
    without tracking a digest of what the nodes share (job name, rendezvous, version)."""
    if not isinstance(job, MultiNodeJob):
        return None
    if cfg.tracking is not None and cfg.tracking.run_id is not None:
        return cfg.tracking.run_id
    shared = f"{job.job_name}|{job.rdzv_endpoint}|{cfg.dataset}"
    return hashlib.sha256(shared.encode()).hexdigest()[:16]


def pin_job(cfg: TrainConfig, job: AnyJob, run_key: str | None = None) -> PinnedJob:
    """Give the job its run's folders, resolve the dataset version, open the MLflow run,
    take the credentials out of the tracking URI; write the result where every node reads
    it, then log the run's params from that file (see the module)."""
    if isinstance(job, MultiNodeJob):
        check_pinned_for_nodes(cfg)
    cfg = cfg.of_run(run_key or nodes_key(cfg, job) or new_run_key())
    manifest, manifest_uri = read_manifest(cfg.dataset)
    check_selection_split(cfg.select_best, manifest.selection_split())  # before any rank
    pinned = cfg.model_copy(update={"dataset": manifest_uri})
    secret_env: dict[str, str] = {}
    opened = cfg.tracking is not None and cfg.tracking.run_id is None
    if cfg.tracking is not None:
        tracking, secret_env = pin_tracking(pinned, cfg.tracking, manifest, job)
        pinned = pinned.model_copy(update={"tracking": tracking})
    uri = dump_train_config(pinned, f"{cfg.output_dir.rstrip('/')}/{PINNED_CONFIG_NAME}")
    sha256 = config_sha256(uri)
    if opened and cfg.tracking is not None and pinned.tracking is not None:
        # The config as given: its tracking URI may hold the credentials the file has not.
        log_pinned_config(cfg.tracking, str(pinned.tracking.run_id), uri, sha256)
    return PinnedJob(pinned, uri, secret_env, sha256)


def log_pinned_config(tracking: TrackingConfig, run_id: str, uri: str, sha256: str) -> None:
    """The run's `train.*` params as read back from the pinned file, its sha256 a tag."""
    from tracking.run.job_config import log_job_config

    fs, path = url_to_fs(uri)
    written = yaml.safe_load(fs.cat_file(path))
    written.pop("tracking", None)  # the run's own coordinates, not a setting of the job
    log_job_config(tracking, run_id, {"train": written}, sha256)


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

    # `train.*` follow once the pinned file is written (`log_pinned_config`).
    params = {"dataset": manifest.config, "num_processes": job.world_size}
    tags = {
        "ballast.strategy": cfg.strategy,
        "ballast.world_size": str(job.world_size),
        CHOSEN_ON_TAG: manifest.selection_split() or "none",
    }
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
