"""A reshard that fails inside its process (a cluster lost, a store that kept failing) and is
called again by the same process, as a Prefect retry of the reshard task does: the retry
resumes what the failed run staged, as a rerun after a kill does (test_kill.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from distributed import Client

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import ReshardResult, run_reshard
from preprocessing.synthetic.tabular import SampleSpec, sample_table, write_sample
from preprocessing.versions.attempt import STAGING_DIR
from tests.log_records import messages, records_of

pytestmark = pytest.mark.slow  # whole reshards on the session Dask cluster


class ClusterLost(RuntimeError):
    """A failure of unknown kind, so transient (preprocessing/toolbox/faults.py)."""


def fail_halfway(error: Exception) -> Callable[[str, int, int], None]:
    """A progress callback raising `error` once half of the write tasks are done."""

    def progress(stage: str, done: int, total: int) -> None:
        if stage == "write" and done * 2 >= total:
            raise error

    return progress


def wait_idle(client: Client, timeout_s: float = 30) -> None:
    """Wait for the tasks the failed run left running: a retry comes seconds later, and a
    write still running then would race the retry's own (same bytes, but not the test's
    point)."""
    deadline = time.monotonic() + timeout_s
    while any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.05)


def digests(result: ReshardResult) -> list[str]:
    return [s.sha256 for split in ("train", "holdout") for s in result.manifest.split(split).shards]


def test_a_retry_in_the_same_process_resumes_a_run_that_failed_mid_write(
    tmp_path: Path, dask_client: Client
) -> None:
    """Invariants: a run failing for a transient reason halfway through its writes keeps
    its staging; the retry (same process) takes it over, keeps at least one shard and
    rewrites at least one, and commits the version a clean run makes, byte-identical,
    leaving no staging. (A permanent failure removes the staging: test_resume.py.)"""
    write_sample(tmp_path / "raw", SampleSpec(num_rows=20_000, num_files=4, seed=5))
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tmp_path / "raw")]),
        output_root=str(tmp_path / "out"),
        target_shard_rows=500,
        rows_per_row_group=250,
        max_tasks_in_flight=2,  # so that tasks are left to run when the run fails
        single_pass_bytes=0,  # the staged route's resume
    )
    staging = tmp_path / "out" / STAGING_DIR
    with pytest.raises(ClusterLost):
        run_reshard(config, dask_client, progress=fail_halfway(ClusterLost("lost")))
    wait_idle(dask_client)
    assert list(staging.glob("*/*/receipts/write-*.json"))
    retry = run_reshard(config, dask_client)
    clean = run_reshard(
        config.model_copy(update={"output_root": str(tmp_path / "clean")}), dask_client
    )
    assert retry.manifest.version_id == clean.manifest.version_id
    assert digests(retry) == digests(clean)
    resumed = retry.manifest.resumed
    assert 0 < resumed["shards_kept"] < resumed["shards"] == len(digests(clean)), resumed
    assert not staging.exists()


def test_a_retry_resumes_an_incremental_child_that_failed_mid_write(
    tmp_path: Path, dask_client: Client
) -> None:
    """Invariants: in incremental mode, a child (a new input file appended to a committed
    parent) failing for a transient reason halfway through its writes keeps its staging;
    the retry keeps the scan of the child's one new file (not the parent's) and at least
    one of its new shards, rewrites at least one, and commits the child a clean run from
    the same parent makes: same version id and parent, byte-identical shards (the
    parent's entries among them), no staging left."""
    raw = tmp_path / "raw"
    write_sample(raw, SampleSpec(num_rows=6_000, num_files=2, seed=5))

    def config(root: str) -> ReshardConfig:
        return ReshardConfig(
            dataset=DatasetSpec(inputs=[str(raw)]),
            output_root=str(tmp_path / root),
            target_shard_rows=500,
            rows_per_row_group=250,
            max_tasks_in_flight=2,
            single_pass_bytes=0,  # the staged route's resume
            mode="incremental",
        )

    parents = {
        run_reshard(config(root), dask_client).manifest.version_id for root in ("out", "clean")
    }
    night = sample_table(np.random.default_rng(1), 1_000_000, 12_000, 0, SampleSpec())
    pq.write_table(night, raw / "night.parquet")
    with pytest.raises(ClusterLost):
        run_reshard(config("out"), dask_client, progress=fail_halfway(ClusterLost("lost")))
    wait_idle(dask_client)
    with records_of("preprocessing.scan.scan_record") as logged:
        retry = run_reshard(config("out"), dask_client)
    clean = run_reshard(config("clean"), dask_client)
    assert messages(logged) == "scan kept: the scans of 1 input file"
    assert len(parents) == 1 and retry.manifest.parent_version in parents
    assert retry.manifest.version_id == clean.manifest.version_id
    assert digests(retry) == digests(clean)
    resumed = retry.manifest.resumed
    new_shards = sum(e.version is None for s in retry.manifest.splits.values() for e in s.shards)
    assert 0 < resumed["shards_kept"] < resumed["shards"] == new_shards, resumed
    assert not (tmp_path / "out" / STAGING_DIR).exists()
