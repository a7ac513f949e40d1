"""The executor: existing Dask clusters run the same code, HPC and Kubernetes clusters are
built from config, and clusters ballast did not start are checked (storage, allocator)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dask
import pytest
import yaml
from distributed import Client
from pydantic import ValidationError

from preprocessing.__main__ import main as preprocessing_main
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_current_version, read_manifest, version_dir
from preprocessing.driver.cluster import (
    PROFILE_KEY,
    DaskConfig,
    build_cluster,
    dask_client,
    kubernetes_cluster_spec,
)
from preprocessing.driver.reshard import run_reshard, version_id_for
from preprocessing.driver.shared_storage import StorageNotShared
from preprocessing.driver.worker_environment import WORKER_MALLOC_ENV, WorkerEnvironmentWarning

REPO = Path(__file__).resolve().parents[2]
DASK_CLI = str(Path(sys.executable).parent / "dask")
ALLOCATOR_SETTINGS = " ".join(f"{name}={value}" for name, value in WORKER_MALLOC_ENV.items())


def worker_env(with_allocator_settings: bool) -> dict[str, str]:
    """The environment of a worker started by hand: this repository on its path, and the
    allocator settings only when asked (this process may carry them from a LocalCluster)."""
    env = {k: v for k, v in os.environ.items() if k not in WORKER_MALLOC_ENV}
    env["PYTHONPATH"] = str(REPO)
    if with_allocator_settings:
        env.update({name: str(value) for name, value in WORKER_MALLOC_ENV.items()})
    return env


def can_unshare_mounts() -> bool:
    """Whether a process here may get a private mount namespace (root, or user namespaces)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


def hiding(directory: Path) -> list[str]:
    """A command prefix: run in a private mount namespace where `directory` is an empty
    tmpfs, as on a host that does not share this host's filesystem."""
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t tmpfs tmpfs "$0" && exec "$@"',
        str(directory),
    ]


@contextmanager
def dask_processes(
    directory: Path,
    workers: list[tuple[str, list[str], dict[str, str]]],
) -> Iterator[str]:
    """`dask scheduler` on 127.0.0.1 and one `dask worker` per (host, command prefix, env),
    each its own process tree, as an operator starts them; yields the scheduler address."""
    scheduler_file = directory / "scheduler.json"
    processes = [
        _start(
            [
                DASK_CLI,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(scheduler_file),
            ],
            directory / "scheduler.log",
            worker_env(False),
        )
    ]
    try:
        address = _wait_for_address(scheduler_file, processes[0])
        for index, (host, prefix, env) in enumerate(workers):
            processes.append(
                _start(
                    [
                        *prefix,
                        DASK_CLI,
                        "worker",
                        address,
                        "--host",
                        host,
                        "--nthreads",
                        "1",
                        "--no-dashboard",
                        "--local-directory",
                        str(directory / f"worker-{index}"),
                    ],
                    directory / f"worker-{index}.log",
                    env,
                )
            )
        with Client(address) as client:
            client.wait_for_workers(len(workers), timeout=120)
        yield address
    finally:
        # Workers first, each while the scheduler still answers: a worker whose scheduler is
        # gone spends its close on reconnect timeouts (16 s of this module's teardown).
        for process in reversed(processes):
            process.terminate()
            process.wait(timeout=60)


def _start(command: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def _wait_for_address(scheduler_file: Path, process: subprocess.Popen) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if scheduler_file.exists() and scheduler_file.stat().st_size:
            return str(json.loads(scheduler_file.read_text())["address"])
        time.sleep(0.2)
    raise RuntimeError(f"dask scheduler did not write {scheduler_file} (exit {process.poll()})")


@pytest.fixture(scope="module")
def operator_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Scheduler and two workers started by hand, with the allocator settings in their
    environment as docs/architecture.md M21 says; the workers listen on 127.0.0.2, another
    host address than the driver's, on the same (so shared) filesystem."""
    env = worker_env(True)
    with dask_processes(
        tmp_path_factory.mktemp("operator"), [("127.0.0.2", [], env), ("127.0.0.2", [], env)]
    ) as address:
        yield address


@pytest.fixture(scope="module")
def unshared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("unshared")


@pytest.fixture(scope="module")
def foreign_cluster(tmp_path_factory: pytest.TempPathFactory, unshared_dir: Path) -> Iterator[str]:
    """One worker on 127.0.0.2 without the allocator settings, which (where mount namespaces
    are allowed) sees an empty `unshared_dir`, like a host without this host's disk."""
    prefix = hiding(unshared_dir) if can_unshare_mounts() else []
    with dask_processes(
        tmp_path_factory.mktemp("foreign"), [("127.0.0.2", prefix, worker_env(False))]
    ) as address:
        yield address


def shard_digests(output_root: Path, version_id: str) -> dict[str, str]:
    """sha256 of every Parquet file of a committed version (in its splits' directories
    too), by its path in the version directory."""
    root = Path(version_dir(str(output_root), version_id))
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*.parquet"))
    }


@pytest.mark.slow
def test_existing_scheduler_on_other_hosts_writes_the_local_clusters_bytes(
    tiny_raw, tmp_path, dask_client, operator_cluster
) -> None:
    """Invariants: `dask.kind: address` against separately started scheduler and workers
    (on another host address, sharing the filesystem) commits the same version id and
    byte-identical shards (sha256 of every file) as the LocalCluster; workers given the
    allocator settings before start draw no warning."""
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tiny_raw)]),
        target_shard_rows=700,
        rows_per_row_group=128,
        output_root=str(tmp_path / "local"),
    )
    local = run_reshard(config, dask_client)
    remote_config = config.model_copy(update={"output_root": str(tmp_path / "remote")})
    with warnings.catch_warnings():
        warnings.simplefilter("error", WorkerEnvironmentWarning)
        remote = run_reshard(remote_config, DaskConfig(kind="address", address=operator_cluster))
    assert not remote.reused and remote.manifest.version_id == local.manifest.version_id
    expected = shard_digests(tmp_path / "local", local.manifest.version_id)
    assert len(expected) > 2
    assert shard_digests(tmp_path / "remote", remote.manifest.version_id) == expected


@pytest.mark.slow
def test_command_line_joins_an_existing_scheduler(
    tiny_raw, tmp_path, operator_cluster, capsys
) -> None:
    """Invariant: `python -m preprocessing --config C --dask D` with a DaskConfig of kind
    `address` commits the config's version through that scheduler; a bad DaskConfig file is
    named in the error with exit status 2."""
    config_path, dask_path = tmp_path / "reshard.yaml", tmp_path / "dask.yaml"
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tiny_raw)]), output_root=str(tmp_path / "out")
    )
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    dask_path.write_text(yaml.safe_dump({"kind": "address", "address": operator_cluster}))
    assert preprocessing_main(["--config", str(config_path), "--dask", str(dask_path)]) == 0
    assert "committed:" in capsys.readouterr().out
    assert read_manifest(str(tmp_path / "out"))[0].version_id == version_id_for(config)
    dask_path.write_text(yaml.safe_dump({"kind": "address"}))
    assert preprocessing_main(["--config", str(config_path), "--dask", str(dask_path)]) == 2
    assert f"{dask_path}:" in capsys.readouterr().err


@pytest.mark.slow
def test_workers_without_the_allocator_settings_are_named_with_the_exact_variables(
    foreign_cluster,
) -> None:
    """Invariant: joining workers that were started without WORKER_MALLOC_ENV warns with
    the worker's address and every variable as NAME=value to set before start."""
    joining = dask_client(DaskConfig(kind="address", address=foreign_cluster))
    with (
        pytest.warns(WorkerEnvironmentWarning, match=re.escape(ALLOCATOR_SETTINGS)) as record,
        joining,
    ):
        pass
    assert "1 of 1 Dask workers (tcp://127.0.0.2:" in str(record[0].message)


@pytest.mark.slow
@pytest.mark.parametrize("worker_profile", [False, True])
def test_local_workers_run_dasks_profiler_only_when_asked(worker_profile: bool) -> None:
    """Invariant: the local workers ballast starts sample their stacks (Dask's `profile`
    callback) exactly when `dask.worker_profile` is set; the driver's own Dask config is
    left as it was."""
    before = dask.config.get(PROFILE_KEY)
    config = DaskConfig(num_workers=1, worker_profile=worker_profile)
    with dask_client(config) as client:
        callbacks = client.run(lambda dask_worker: sorted(dask_worker.periodic_callbacks))
    assert [("profile" in names) for names in callbacks.values()] == [worker_profile]
    assert dask.config.get(PROFILE_KEY) == before


@pytest.mark.slow
@pytest.mark.filterwarnings(
    "ignore::preprocessing.driver.worker_environment.WorkerEnvironmentWarning"
)
def test_local_output_that_workers_on_other_hosts_cannot_see_is_refused(
    tiny_raw, unshared_dir, foreign_cluster
) -> None:
    """Invariant: a local output root that a worker on another host does not see (its own
    filesystem there) stops the reshard before any task, naming the path and the worker,
    and commits nothing."""
    if not can_unshare_mounts():
        pytest.skip("no private mount namespaces here: cannot give a worker its own disk")
    output_root = unshared_dir / "datasets"
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tiny_raw)]), output_root=str(output_root)
    )
    with pytest.raises(
        StorageNotShared,
        match=rf"{re.escape(str(output_root))} is a local "
        r"path, but Dask workers tcp://127\.0\.0\.2:\d+ on other hosts",
    ):
        run_reshard(config, DaskConfig(kind="address", address=foreign_cluster))
    assert read_current_version(str(output_root)) is None
    assert list(output_root.iterdir()) == []


@pytest.mark.parametrize(
    ("kind", "directives"),
    [
        ("slurm", ["#SBATCH -p cpu", "#SBATCH -A data", "#SBATCH -t 01:00:00"]),
        ("pbs", ["#PBS -q cpu", "#PBS -A data", "#PBS -l walltime=01:00:00"]),
    ],
)
def test_hpc_job_script_exports_the_allocator_settings_before_the_worker(kind, directives) -> None:
    """Invariants: a dask-jobqueue cluster built from config (no job submitted) renders the
    configured queue, account and walltime, and its script exports every allocator setting
    before the user's prologue and before the worker starts."""
    config = DaskConfig(
        kind=kind,
        num_workers=4,
        options={
            "cores": 1,
            "memory": "2GB",
            "queue": "cpu",
            "account": "data",
            "walltime": "01:00:00",
            "job_script_prologue": ["source /opt/ballast/bin/activate"],
            "scheduler_options": {"dashboard_address": ":0"},
        },
    )
    with build_cluster(config) as cluster:
        lines = cluster.job_script().splitlines()
    for directive in directives:
        assert directive in lines
    exports = [lines.index(f"export {name}={value}") for name, value in WORKER_MALLOC_ENV.items()]
    prologue = lines.index("source /opt/ballast/bin/activate")
    worker = next(i for i, line in enumerate(lines) if "distributed.cli.dask_worker" in line)
    assert max(exports) < prologue < worker


def test_kubernetes_cluster_spec_carries_workers_image_and_allocator_env() -> None:
    """Invariants: the dask-kubernetes `DaskCluster` resource built from config (no cluster)
    has `num_workers` replicas of the configured image, every pod's environment holds the
    allocator settings (as strings) beside the user's, and KubeCluster-only options such as
    `namespace` stay out of the resource."""
    spec = kubernetes_cluster_spec(
        DaskConfig(
            kind="kubernetes",
            num_workers=3,
            options={
                "name": "reshard",
                "image": "ballast-preprocessing:0.1.0",
                "namespace": "data",
                "env": {"AWS_REGION": "eu-west-1"},
            },
        )
    )
    assert spec["kind"] == "DaskCluster" and spec["metadata"] == {"name": "reshard"}
    assert spec["spec"]["worker"]["replicas"] == 3
    expected_env = [{"name": k, "value": str(v)} for k, v in WORKER_MALLOC_ENV.items()]
    expected_env.append({"name": "AWS_REGION", "value": "eu-west-1"})
    for role in ("worker", "scheduler"):
        (container,) = spec["spec"][role]["spec"]["containers"]
        assert container["image"] == "ballast-preprocessing:0.1.0"
        assert container["env"] == expected_env
    assert "namespace" not in json.dumps(spec)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"kind": "address"}, "dask.address is required"),
        ({"kind": "local", "address": "tcp://127.0.0.1:8786"}, "dask.address is only read"),
        ({"kind": "kubernetes"}, "dask.options.image is required"),
        ({"kind": "local", "workers": 2}, "workers"),
    ],
)
def test_dask_config_names_the_bad_setting(settings, field) -> None:
    """Invariant: a DaskConfig that cannot run fails at validation, naming the field."""
    with pytest.raises(ValidationError, match=re.escape(field)):
        DaskConfig.model_validate(settings)
