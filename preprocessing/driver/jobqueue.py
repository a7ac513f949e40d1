"""Dask workers as batch jobs (`dask.kind: slurm` / `pbs`, through dask-jobqueue): the
cluster's job script, the site's settings, and the wait for its first worker.

- `JobSettings` (`dask.jobs`): partition, account, QOS, memory, constraint, walltime and
  further sbatch options of the worker jobs, typed; dask-jobqueue's own keyword arguments
  stay in `dask.options`, and a setting given in both places is refused.
- The job script exports the allocator settings (worker_environment.WORKER_MALLOC_ENV) and
  unsets the variables that name a path only the submitting host has
  (preprocessing/contract/slurm.py `host_only_variables`: the `ballast` command's worker
  log config; a file in its /tmp), which sbatch would otherwise pass in and a worker with
  a private /tmp would die on.
- The scheduler's dashboard listens where `dask.dashboard_address` says (default: a free
  port), not on 8787 of a login node several people share.
- Before the first job is submitted, `sbatch --test-only` checks the script: a partition,
  account or QOS the site refuses is a config error naming sbatch's reason, not a wait.
- `wait_for_job_workers` waits at most `dask.worker_timeout_s` for the first worker and
  fails naming each job and SLURM's reason (`PENDING: Resources`, a job that ended with
  its output file), at once when every job has ended without a worker.
- `watch_worker_loss` watches a step's cluster once its workers joined: a cluster whose
  workers all went away (the jobs' walltime, `scancel`, a node failure) gets no new ones
  (the jobs are not resubmitted), so the step is failed instead of waiting with no worker:
  at once when every job has ended, else at `dask.worker_timeout_s`, with `WorkersLost`
  naming each job, its SLURM state and what slurmstepd wrote when it ended it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dask
from distributed import Client, KilledWorker
from distributed.comm.core import CommClosedError
from pydantic import BaseModel, ConfigDict, Field, field_validator

from preprocessing.contract.slurm import (
    JobState,
    check_sbatch_options,
    host_only_variables,
    job_environment,
    job_state,
    slurm_notice,
    submit,
)
from preprocessing.toolbox.faults import TransientError

POLL_S = 2.0
# A step that failed on a closed connection waits this long for its jobs to end: scancel's
# and a walltime's jobs are ended within a second or two of their workers leaving.
SETTLE_S, SETTLE_POLL_S = 10.0, 0.5
LOSS_ERRORS = (CommClosedError, KilledWorker, asyncio.CancelledError)
log = logging.getLogger(__name__)
# Options of `JobSettings` and the SLURMCluster / PBSCluster keyword each one becomes.
JOBQUEUE_KEYWORDS = {
    "partition": "queue",
    "account": "account",
    "memory": "memory",
    "walltime": "walltime",
}
SLURM_ONLY = ("qos", "constraint")


class WorkersNotReady(TransientError, RuntimeError):
    """No Dask worker joined in time: the jobs are pending or ended. Transient: a queue
    that held the jobs may not later, so a step retried on transient errors waits again."""


class WorkersLost(TransientError, RuntimeError):
    """Every Dask worker of a step went away and none came back: the step failed instead of
    waiting. Transient: a retried step starts a cluster of new jobs."""


class JobSettings(BaseModel):
    """What a site asks of every worker job (`dask.jobs`); unset fields keep
    dask-jobqueue's defaults (its config or `dask.options`)."""

    model_config = ConfigDict(extra="forbid")

    partition: str | None = Field(None, description="Partition (SLURM) or queue (PBS).")
    account: str | None = Field(None, description="Account charged for the jobs.")
    qos: str | None = Field(None, description="SLURM quality of service (--qos).")
    memory: str | None = Field(None, description="Memory per job, e.g. 24GiB.")
    constraint: str | None = Field(None, description="SLURM node features (--constraint).")
    walltime: str | None = Field(None, description="Time limit of each job (HH:MM:SS).")
    sbatch_options: list[str] = Field(
        default_factory=list,
        description="Further job options, one per item "
        "(e.g. --reservation=ml), written as directives of the job script.",
    )

    @field_validator("sbatch_options")
    @classmethod
    def options_are_flags(cls, options: list[str]) -> list[str]:
        return check_sbatch_options(options, "dask.jobs.sbatch_options")


def jobqueue_options(
    kind: str,
    options: dict[str, Any],
    jobs: JobSettings,
    dashboard_address: str,
    worker_env: dict[str, int],
) -> dict[str, Any]:
    """The keyword arguments of the cluster class: `options` with `jobs` mapped in, the
    prologue that unsets the host-only variables and exports `worker_env` before the
    user's, and the dashboard address."""
    merged = dict(options)
    for field, keyword in JOBQUEUE_KEYWORDS.items():
        value = getattr(jobs, field)
        if value is not None and keyword in merged:
            raise ValueError(f"dask.jobs.{field} and dask.options.{keyword} both set: keep one")
        if value is not None:
            merged[keyword] = value
    merged["job_extra_directives"] = [
        *merged.get("job_extra_directives", []),
        *extra_directives(kind, jobs),
    ]
    prologue = merged.pop("job_script_prologue", None)
    if prologue is None:
        prologue = dask.config.get(f"jobqueue.{kind}.job-script-prologue", default=[])
    exports = [f"export {name}={value}" for name, value in worker_env.items()]
    unset = host_only_variables(os.environ)
    merged["job_script_prologue"] = ([f"unset {' '.join(unset)}"] if unset else []) + exports
    merged["job_script_prologue"] += list(prologue or [])
    scheduler = dict(merged.pop("scheduler_options", {}))
    scheduler.setdefault("dashboard_address", dashboard_address)
    return merged | {"scheduler_options": scheduler}


def extra_directives(kind: str, jobs: JobSettings) -> list[str]:
    """The job directives of `jobs` that the cluster class has no keyword for."""
    given = [name for name in SLURM_ONLY if getattr(jobs, name) is not None]
    if kind != "slurm" and given:
        raise ValueError(f"dask.jobs.{given[0]}: a SLURM setting, not of dask.kind {kind!r}")
    flags = [f"--{name}={getattr(jobs, name)}" for name in given]
    return flags + list(jobs.sbatch_options)


def check_submission(cluster: Any, kind: str) -> None:
    """`sbatch --test-only` of the cluster's job script: a job SLURM refuses (partition,
    account, QOS, limits) raises SubmissionRefused before any is submitted."""
    if kind != "slurm":
        return
    with tempfile.TemporaryDirectory() as scratch:
        script = os.path.join(scratch, "dask-worker.sh")
        with open(script, "w") as handle:
            handle.write(cluster.job_script())
        submit(script, job_environment(), "the Dask worker jobs", test_only=True)


def wait_for_job_workers(cluster: Any, client: Client, timeout_s: float, kind: str) -> None:
    """Return once a worker joined; raise WorkersNotReady naming the jobs and their state
    at `timeout_s`, or as soon as every submitted job ended without a worker."""
    deadline = time.monotonic() + timeout_s
    while not client.scheduler_info(n_workers=-1)["workers"]:
        states = job_states(cluster) if kind == "slurm" else []
        if states and all(state.ended for state in states):
            raise WorkersNotReady(
                not_ready("every worker job ended before a worker joined", states)
            )
        if time.monotonic() >= deadline:
            raise WorkersNotReady(
                not_ready(
                    f"no Dask worker joined in {timeout_s:g} s (dask.worker_timeout_s)", states
                )
            )
        time.sleep(POLL_S)
    jobs = ", ".join(state.job_id for state in job_states(cluster)) if kind == "slurm" else ""
    log.info("Dask workers joined%s", f" from SLURM jobs {jobs}" if jobs else "")


def job_states(cluster: Any) -> list[JobState]:
    """The SLURM state of each worker job the cluster submitted (those SLURM still knows)."""
    ids = [job.job_id for job in list(cluster.workers.values()) if job.job_id]
    return [state for state in map(job_state, ids) if state is not None]


def not_ready(what: str, states: list[JobState]) -> str:
    jobs = "; ".join(state.describe() for state in states) or (
        "no job was submitted (the submission's error is in the run's log)"
    )
    return f"{what}: {jobs}"


@contextmanager
def watch_worker_loss(cluster: Any, client: Client, timeout_s: float, kind: str) -> Iterator[None]:
    """While the block runs on `client`: fail it with `WorkersLost` once its cluster has
    had no worker for `timeout_s`, or as soon as every job has ended (closing the client,
    which cancels the tasks the block waits for)."""
    watch = LossWatch(cluster, client, timeout_s, kind)
    watch.start()
    try:
        yield
    except (Exception, asyncio.CancelledError) as error:  # a cancelled wait is the latter
        lost = watch.lost or (watch.settle() if isinstance(error, LOSS_ERRORS) else None)
        if lost:
            raise WorkersLost(lost) from error
        raise
    finally:
        watch.stop()


class LossWatch(threading.Thread):
    """Polls the scheduler for workers (and SLURM for the jobs' states, kept from while
    they ran for jobs SLURM later forgets); sets `lost` and closes the client on a loss."""

    def __init__(self, cluster: Any, client: Client, timeout_s: float, kind: str) -> None:
        super().__init__(daemon=True, name="worker-loss-watch")
        self.cluster, self.client, self.timeout_s, self.kind = cluster, client, timeout_s, kind
        self.lost: str | None = None
        self.states: dict[str, JobState] = {}
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()
        self.join()

    def settle(self) -> str | None:
        """After the block failed on a closed connection (a call to every worker, as
        `client.run`, fails at once when one goes, before a poll sees it): the loss, if
        the workers are gone and their jobs end within `SETTLE_S`, else None."""
        self.stop()
        since, deadline = None, time.monotonic() + SETTLE_S
        while self.lost is None and time.monotonic() < deadline:
            since = self.check(since)
            time.sleep(SETTLE_POLL_S)
        return self.lost

    def run(self) -> None:
        since: float | None = None
        while not self._stopped.wait(POLL_S) and self.lost is None:
            try:
                since = self.check(since)
            except Exception as error:  # the watch never fails the step it watches
                log.debug("worker loss watch: %s", error)

    def check(self, since: float | None) -> float | None:
        """One poll; when the workers are gone, the time they were first seen gone."""
        self.states |= {state.job_id: state for state in self.job_states()}
        if self.client.scheduler_info(n_workers=-1)["workers"]:
            return None
        states = list(self.states.values())
        if states and all(state.ended for state in states):
            self.fail(lost_message("every Dask worker left and its job ended", states))
        elif since is None:
            waiting = f"waiting up to {self.timeout_s:g} s (dask.worker_timeout_s) for one"
            log.warning("%s", lost_message(f"every Dask worker left; {waiting}", states))
            since = time.monotonic()
        elif time.monotonic() - since >= self.timeout_s:
            what = f"none came back in {self.timeout_s:g} s (dask.worker_timeout_s)"
            self.fail(lost_message(f"every Dask worker left and {what}", states))
        return since

    def job_states(self) -> list[JobState]:
        return job_states(self.cluster) if self.kind == "slurm" else []

    def fail(self, message: str) -> None:
        self.lost = message
        log.error("%s", message)
        self.client.close()


def lost_message(what: str, states: list[JobState]) -> str:
    """`what`, each job's state and what slurmstepd said when it ended it."""
    said = [
        f"; slurmstepd in {state.error_path}: {notice}"
        for state in states
        if (notice := slurm_notice(state))
    ]
    return not_ready(what, states) + "".join(said)
