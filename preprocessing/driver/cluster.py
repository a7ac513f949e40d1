"""The one Dask cluster factory: where a driver's tasks run, apart from the driver.

A reshard or a batch-inference map is a driver (list, plan, submit, commit, on this
process) and an executor (Dask workers). This module is the only place a cluster is
chosen, started or joined: worker processes here, an existing scheduler, Kubernetes
(dask-kubernetes) or SLURM / PBS (dask-jobqueue), by config and never by code path, so
the same driver runs on a laptop and on a cluster.

Every client handed out is checked: workers on other hosts must see local staging and
output paths (a shared filesystem: preprocessing/driver/shared_storage.py), and workers
ballast did not start are told which allocator settings they lack (docs/architecture.md
M21: preprocessing/driver/worker_environment.py).
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from inspect import signature
from typing import Any, Literal

import dask
from distributed import Client, LocalCluster
from pydantic import BaseModel, ConfigDict, Field, model_validator

from preprocessing.driver.jobqueue import (
    JobSettings,
    check_submission,
    jobqueue_options,
    wait_for_job_workers,
    watch_worker_loss,
)
from preprocessing.driver.shared_storage import require_shared_storage
from preprocessing.driver.worker_environment import (
    WORKER_MALLOC_ENV,
    warn_missing_allocator_settings,
)
from preprocessing.driver.worker_start import main_script_left_out, own_packages_only

# Dask's statistical profiler samples every worker thread's stack every 10 ms (for the
# dashboard's Profile page): 1.5-2 of 27 worker CPU-s of a reshard of 5,000 small files
# (benchmarks/RESULTS.md M31). Off on the local workers ballast starts unless
# `dask.worker_profile` turns it on.
PROFILE_KEY = "distributed.worker.profile.enabled"
LOCAL_STARTS = 2
# Dask's own clocks on every server it starts (scheduler, nannies, workers): a tick every
# 20 ms that only warns of an event loop blocked past 3 s, and a system monitor every 500
# ms for the dashboard's graphs. An idle 2-worker LocalCluster spent 11.1 % of a core on
# them (6.0 % the scheduler's process, 2.6 % each worker); at the tick of Dask's own test
# clusters and a 2 s monitor, 5.0 %. The warning still fires past its limit.
QUIET_CLOCKS = {
    "distributed.admin.tick.interval": "500ms",
    "distributed.admin.system-monitor.interval": "2s",
}

# A `logging.dictConfig` for Dask's worker processes in their environment (flows/cli/console.py
# sets one for a command's duration: INFO lines to the run's log file, the console quiet)
# decides their handlers' levels itself. LocalCluster's `silence_logs` would raise every
# StreamHandler of `distributed` to WARNING, a FileHandler included, in the workers and in
# this process, so it is turned off then; without one the default keeps workers quiet.
WORKER_LOGGING_ENV = "DASK_DISTRIBUTED__LOGGING"

# Kinds whose workers are batch jobs ballast submits: waited for with a deadline, and
# started per Dask step of a flow run (`run_executor`).
BATCH_KINDS = frozenset({"slurm", "pbs", "kubernetes"})

# kind -> (module, cluster class, the package and ballast extra that install it)
_EXTERNAL = {
    "kubernetes": ("dask_kubernetes.operator", "KubeCluster", "dask-kubernetes", "kubernetes"),
    "slurm": ("dask_jobqueue", "SLURMCluster", "dask-jobqueue", "slurm"),
    "pbs": ("dask_jobqueue", "PBSCluster", "dask-jobqueue", "slurm"),
}


class DaskConfig(BaseModel):
    """Where Dask tasks run: the executor, chosen by config."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "threads", "address", "kubernetes", "slurm", "pbs"] = Field(
        "local",
        description="`local`: worker processes on this host; `threads`: one worker of "
        "`num_workers` threads inside this process (no worker to start or import: for "
        "inputs of seconds); `address`: an existing scheduler (workers started by someone "
        "else); `kubernetes`: a dask-kubernetes operator cluster; `slurm` / `pbs`: "
        "dask-jobqueue jobs.",
    )
    address: str | None = Field(
        None, description="Scheduler address for kind `address`, e.g. `tcp://10.0.0.5:8786`."
    )
    num_workers: int = Field(
        2,
        gt=0,
        description="Workers to start (every kind but `address`, which uses the "
        "workers already there).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the cluster: LocalCluster "
        "(`local`), `make_cluster_spec` and KubeCluster (`kubernetes`: `image` with ballast "
        "installed is required; `namespace`, `resources`, `env`), SLURMCluster / PBSCluster "
        "(`cores`, `memory`, `queue`, `account`, `walltime`, `job_script_prologue`).",
    )
    worker_profile: bool = Field(
        False,
        description="Dask's statistical profiler (the dashboard's Profile page) on the "
        "workers of kind `local`; it costs about 6% of their CPU.",
    )
    jobs: JobSettings = Field(
        default_factory=JobSettings,
        description="The site's settings of the worker jobs "
        "(kind `slurm` / `pbs`): partition, account, QOS, memory, constraint, walltime, "
        "further options.",
    )
    worker_timeout_s: float = Field(
        600.0,
        gt=0,
        description="How long a cluster ballast starts may take to get its "
        "first worker (a job may wait in a queue); then an error names the jobs and "
        "SLURM's reason.",
    )
    dashboard_address: str = Field(
        ":0",
        description="Where the dashboard of a scheduler ballast starts for batch jobs "
        "listens (default: a free port, not 8787 of a shared login node).",
    )

    @model_validator(mode="after")
    def _settings_of_the_kind(self) -> DaskConfig:
        if self.kind == "address" and not self.address:
            raise ValueError("dask.address is required when dask.kind is 'address'")
        if self.kind != "address" and self.address:
            raise ValueError(
                f"dask.address is only read when dask.kind is 'address', not {self.kind!r}"
            )
        if self.kind not in ("slurm", "pbs") and self.jobs != JobSettings():
            raise ValueError(
                f"dask.jobs is only read when dask.kind is 'slurm' or 'pbs', not {self.kind!r}"
            )
        if self.kind == "kubernetes" and "image" not in self.options:
            raise ValueError(
                "dask.options.image is required when dask.kind is 'kubernetes': "
                "an image with ballast installed (workers import its tasks)"
            )
        return self


Executor = Client | DaskConfig


@contextmanager
def dask_client(executor: Executor, storage: Sequence[str] = ()) -> Iterator[Client]:
    """A checked client: the caller's own (left open), or one for `executor`'s cluster,
    closed (and a cluster it started stopped) on exit. `storage`: the URIs workers write
    and read besides the inputs (staging, output); local ones must be shared."""
    if isinstance(executor, Client):
        check_workers(executor, storage)
        yield executor
        return
    with _connect(executor) as client:
        check_workers(client, storage)
        yield client


@contextmanager
def _connect(config: DaskConfig) -> Iterator[Client]:
    if config.kind == "address":
        with Client(config.address) as client:
            yield client
        return
    with build_cluster(config) as cluster:
        check_submission(cluster, config.kind)
        cluster.scale(1 if config.kind == "threads" else config.num_workers)  # its threads
        with Client(cluster) as client:
            if config.kind not in BATCH_KINDS:
                yield client
                return
            wait_for_job_workers(cluster, client, config.worker_timeout_s, config.kind)
            with watch_worker_loss(cluster, client, config.worker_timeout_s, config.kind):
                yield client


@contextmanager
def run_executor(config: DaskConfig) -> Iterator[Executor]:
    """What the Dask steps of one flow run share: a client of one cluster for every step
    when the workers are local or already running; the config itself for a cluster of
    batch jobs (slurm, pbs, kubernetes), so that each step starts its own cluster and its
    jobs end with the step: none waits idle between steps (through training) or reaches
    its walltime before the next step starts."""
    if config.kind in BATCH_KINDS:
        yield config
        return
    with dask_client(config) as client:
        yield client


def build_cluster(config: DaskConfig) -> Any:
    """The cluster object of a kind ballast starts, workers not requested yet (no job is
    submitted and no pod created until it is scaled)."""
    if config.kind == "local":
        return local_cluster(config.num_workers, config.worker_profile, **config.options)
    if config.kind == "threads":
        return threads_cluster(config.num_workers, **config.options)
    if config.kind == "kubernetes":
        return _kubernetes_cluster(config)
    if config.kind in ("slurm", "pbs"):
        return _jobqueue_cluster(config)
    raise ValueError(f"dask.kind={config.kind!r} joins a running cluster; nothing to build")


def threads_cluster(num_threads: int, **options: Any) -> LocalCluster:
    """A LocalCluster of one worker of `num_threads` threads in this process: no process
    to spawn, no imports to repeat, no result to pickle between processes (a reshard of
    0.06 GB: 1.4-1.8 s against 6.0-8.7 s on two worker processes, benchmarks/RESULTS.md
    M64). Its tasks share this process's memory and GIL (pyarrow decodes and encodes
    without it), so it suits inputs whose rows fit the single pass's budget."""
    with dask.config.set({**QUIET_CLOCKS, PROFILE_KEY: False}):
        return LocalCluster(
            n_workers=1,
            threads_per_worker=num_threads,
            processes=False,
            dashboard_address=None,
            **options,
        )


def local_cluster(num_workers: int, worker_profile: bool = False, **options: Any) -> LocalCluster:
    """A LocalCluster of single-threaded worker processes with the allocator settings and,
    unless `worker_profile`, without Dask's statistical profiler; with a worker logging
    config in the environment, its handlers' levels left as it set them. A worker process
    that dies while its nanny starts it fails the whole start ("Nanny failed to start": one
    soak night's worker kill landed there); the start is tried `LOCAL_STARTS` times."""
    environ = {
        f"distributed.nanny.pre-spawn-environ.{name}": value
        for name, value in WORKER_MALLOC_ENV.items()
    }
    silence = {"silence_logs": False} if WORKER_LOGGING_ENV in os.environ else {}
    for start in range(1, LOCAL_STARTS + 1):
        try:
            with (
                dask.config.set({**environ, **QUIET_CLOCKS, PROFILE_KEY: worker_profile}),
                own_packages_only(),
                main_script_left_out(),
            ):
                return LocalCluster(
                    n_workers=num_workers,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=":0",
                    **{**silence, **options},
                )
        except RuntimeError as error:  # LocalCluster closes what it started before raising
            if "failed to start" not in str(error) or start == LOCAL_STARTS:
                raise
    raise AssertionError("unreachable")


def _kubernetes_cluster(config: DaskConfig) -> Any:
    """A KubeCluster of `kubernetes_cluster_spec`; options that are not the spec's (such as
    `namespace`) are KubeCluster's own."""
    options = {k: v for k, v in config.options.items() if k not in _spec_parameters()}
    operator = _import_extra("kubernetes")
    return operator.KubeCluster(custom_cluster_spec=kubernetes_cluster_spec(config), **options)


def kubernetes_cluster_spec(config: DaskConfig) -> dict[str, Any]:
    """The `DaskCluster` resource for the dask-kubernetes operator: `num_workers` replicas,
    the allocator settings in every pod's environment."""
    operator = _import_extra("kubernetes")
    spec = {k: v for k, v in config.options.items() if k in _spec_parameters()}
    spec["name"] = spec.get("name") or f"ballast-{uuid.uuid4().hex[:8]}"
    spec["env"] = _with_allocator_env(spec.get("env"))
    spec["n_workers"] = config.num_workers
    return dict(operator.make_cluster_spec(**spec))


def _spec_parameters() -> set[str]:
    return set(signature(_import_extra("kubernetes").make_cluster_spec).parameters)


def _with_allocator_env(env: dict[str, Any] | list[dict[str, Any]] | None) -> Any:
    """The user's pod environment (a dict or a Kubernetes env list) plus the allocator
    settings it does not set itself; Kubernetes wants string values."""
    ours = {name: str(value) for name, value in WORKER_MALLOC_ENV.items()}
    if isinstance(env, list):
        named = {entry.get("name") for entry in env}
        return [{"name": k, "value": v} for k, v in ours.items() if k not in named] + env
    return {**ours, **{k: str(v) for k, v in (env or {}).items()}}


def _jobqueue_cluster(config: DaskConfig) -> Any:
    """A SLURMCluster / PBSCluster whose job scripts export the allocator settings before
    the worker starts, ahead of the user's prologue (options or jobqueue's config), with
    `dask.jobs` and the dashboard address (preprocessing/driver/jobqueue.py)."""
    module = _import_extra(config.kind)
    options = jobqueue_options(
        config.kind, config.options, config.jobs, config.dashboard_address, WORKER_MALLOC_ENV
    )
    return getattr(module, _EXTERNAL[config.kind][1])(**options)


def _import_extra(kind: str) -> Any:
    module_name, _, package, extra = _EXTERNAL[kind]
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(
            f"dask.kind={kind!r} needs the {package} package: pip install 'ballast[{extra}]'"
        ) from error


def check_workers(client: Client, storage: Sequence[str] = ()) -> None:
    """Fail when a local path in `storage` is out of reach of workers on other hosts;
    warn about workers without the allocator settings. Checks the workers there now
    (workers that join later are not checked)."""
    require_shared_storage(client, storage)
    warn_missing_allocator_settings(client)
