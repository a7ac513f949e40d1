"""What a SLURM job is given, without submitting one: the environment sbatch may pass in
(nothing naming a path only the submitting host has), and the site's settings of the Dask
worker jobs written into their job script."""

from __future__ import annotations

import tempfile

import pytest
from pydantic import ValidationError

from preprocessing.contract.slurm import (
    JobState,
    expand_pattern,
    host_only_variables,
    job_environment,
)
from preprocessing.driver.cluster import DaskConfig, build_cluster, run_executor


def test_host_only_variables_stay_out_of_a_jobs_environment() -> None:
    """Invariant: the worker log config of a `ballast` command and any variable naming a
    file in this host's temporary directory are dropped; the rest (credentials, PATH)
    passes unchanged."""
    temporary = tempfile.gettempdir()
    environ = {
        "DASK_DISTRIBUTED__LOGGING": "{'filename': '/shared/run.log'}",
        "MLFLOW_TRACKING_URI": f"sqlite:///{temporary}/mlflow.db",
        "AWS_SECRET_ACCESS_KEY": "k",
        "PATH": "/usr/bin",
        "TMPDIR": temporary,
    }
    assert host_only_variables(environ) == ["DASK_DISTRIBUTED__LOGGING", "MLFLOW_TRACKING_URI"]
    assert job_environment(environ) == {
        "AWS_SECRET_ACCESS_KEY": "k",
        "PATH": "/usr/bin",
        "TMPDIR": temporary,
    }


def test_a_job_state_says_why_it_waits_or_ended_and_where_its_output_is() -> None:
    """Invariant: the description names the job, SLURM's pending reason, the time limit
    of a job that reached it, or the exit code, and always the output file."""
    pending = JobState("7", "PENDING", "Resources", 0, "/o/7.out", "01:00:00")
    timeout = JobState("8", "TIMEOUT", "TimeLimit", 0, "/o/8.out", "01:00:00")
    failed = JobState("9", "FAILED", "NonZeroExitCode", 1, "/o/9.out", "01:00:00")
    assert pending.describe() == "SLURM job 7 (PENDING: Resources; its output: /o/7.out)"
    assert timeout.describe() == (
        "SLURM job 8 (TIMEOUT: it reached its time limit of 01:00:00; its output: /o/8.out)"
    )
    assert failed.describe() == "SLURM job 9 (FAILED, exit code 1; its output: /o/9.out)"
    assert expand_pattern("/logs/%x-%J.out", "12", "dask") == "/logs/dask-12.out"


def test_dask_job_settings_become_directives_and_host_only_variables_are_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariants: `dask.jobs` (partition, account, QOS, memory, constraint, walltime,
    further options) is written into the worker job script, which unsets the command's
    worker log config before the worker starts; the scheduler's dashboard takes a free
    port; a setting given in `jobs` and `options` both, or a SLURM-only one on PBS, or
    `jobs` on a kind without job scripts, is refused naming the fields."""
    pytest.importorskip("dask_jobqueue")
    monkeypatch.setenv("DASK_DISTRIBUTED__LOGGING", "{}")
    config = DaskConfig(
        kind="slurm",
        options={"cores": 1},
        jobs={
            "partition": "cpu",
            "account": "data",
            "qos": "low",
            "memory": "2GiB",
            "constraint": "avx2",
            "walltime": "00:30:00",
            "sbatch_options": ["--exclusive"],
        },
    )
    with build_cluster(config) as cluster:
        lines = cluster.job_script().splitlines()
        dashboard = cluster.dashboard_link
    assert {
        "#SBATCH -p cpu",
        "#SBATCH -A data",
        "#SBATCH --qos=low",
        "#SBATCH -t 00:30:00",
        "#SBATCH --constraint=avx2",
        "#SBATCH --exclusive",
    } <= set(lines)
    [unset] = [
        i
        for i, line in enumerate(lines)
        if line.startswith("unset ") and "DASK_DISTRIBUTED__LOGGING" in line.split()
    ]
    assert unset < next(i for i, line in enumerate(lines) if "dask_worker" in line)
    assert ":8787/" not in dashboard
    with pytest.raises(ValueError, match=r"dask\.jobs\.account and dask\.options\.account"):
        build_cluster(
            DaskConfig(
                kind="slurm",
                options={"cores": 1, "account": "x"},
                jobs={"account": "y", "memory": "1GiB"},
            )
        )
    with pytest.raises(ValueError, match=r"dask\.jobs\.qos: a SLURM setting"):
        build_cluster(
            DaskConfig(kind="pbs", options={"cores": 1, "memory": "1GiB"}, jobs={"qos": "low"})
        )
    with pytest.raises(ValidationError, match=r"dask\.jobs is only read"):
        DaskConfig(kind="local", jobs={"account": "x"})


@pytest.mark.parametrize("kind", ["slurm", "pbs", "kubernetes"])
def test_a_flow_run_holds_no_cluster_of_batch_jobs_between_its_steps(kind: str) -> None:
    """Invariant: for a cluster of batch jobs the flow run's executor is the config itself,
    so each Dask step starts its own cluster and ends its jobs (none idles through
    training or reaches its walltime between steps); nothing is started here."""
    options = {"image": "ballast:1"} if kind == "kubernetes" else {"cores": 1}
    config = DaskConfig(kind=kind, options=options)
    with run_executor(config) as executor:
        assert executor is config
