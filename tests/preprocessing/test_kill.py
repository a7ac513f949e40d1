"""A reshard killed with SIGKILL mid-write leaves no visible version; the rerun completes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from distributed import Client, LocalCluster

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.manifest import MANIFEST_NAME, read_current_version, read_manifest
from preprocessing.reshard import run_reshard
from preprocessing.sample import SampleSpec, write_sample


def start_reshard(config: ReshardConfig, directory: Path) -> subprocess.Popen:
    path = directory / "reshard.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return subprocess.Popen([sys.executable, "-m", "preprocessing", "--config", str(path)],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def wait_for_shards(root: Path, process: subprocess.Popen, timeout_s: float = 120) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        written = list(root.glob("v-*/shard-*.parquet"))
        if written:
            return len(written)
        time.sleep(0.02)
    raise AssertionError("the reshard wrote no shard before it ended or timed out")


def test_killed_reshard_leaves_no_version_and_rerun_commits_the_same_one(tmp_path,
                                                                         dask_client) -> None:
    """Invariants: after SIGKILL of the whole process group mid-write, no manifest and no
    `_CURRENT` exist; the rerun commits the version id a clean run makes, with byte-identical
    shards (no row lost or duplicated)."""
    write_sample(tmp_path / "raw", SampleSpec(num_rows=120_000, num_files=8, seed=11))
    config = ReshardConfig(dataset=DatasetSpec(inputs=[str(tmp_path / "raw")]),
                           output_root=str(tmp_path / "out"), target_shard_rows=1_000,
                           rows_per_row_group=500)
    process = start_reshard(config, tmp_path)
    wait_for_shards(tmp_path / "out", process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    assert not list((tmp_path / "out").glob(f"v-*/{MANIFEST_NAME}"))
    assert read_current_version(str(tmp_path / "out")) is None
    rerun = run_reshard(config, dask_client)
    clean = run_reshard(config.model_copy(update={"output_root": str(tmp_path / "clean")}),
                        dask_client)
    assert rerun.manifest.version_id == clean.manifest.version_id
    digests = lambda r: [s.sha256 for s in r.manifest.split("train").shards]  # noqa: E731
    assert digests(rerun) == digests(clean)
    assert read_manifest(str(tmp_path / "out"))[0].version_id == rerun.manifest.version_id


@pytest.mark.slow
def test_a_dask_worker_killed_mid_exchange_changes_nothing(tiny_raw, tmp_path,
                                                           dask_client) -> None:
    """Invariant: SIGKILL of one of two workers while exchange tasks are in flight (its
    nanny restarts it, Dask reruns its tasks) still commits the version a clean run makes,
    with byte-identical shards: a rerun task rewrites the same staged object."""
    config = ReshardConfig(dataset=DatasetSpec(inputs=[str(tiny_raw)]),
                           output_root=str(tmp_path / "killed"), target_shard_rows=300,
                           max_piece_rows=60, exchange_task_bytes=1, exchange_fan_in=2,
                           max_tasks_in_flight=4)
    killed: list[tuple[int, int]] = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        victim = min(client.run(os.getpid).values())

        def kill_one(stage: str, done: int, total: int) -> None:
            if stage == "exchange" and done >= total // 3 and not killed:
                os.kill(victim, signal.SIGKILL)
                killed.append((done, total))

        result = run_reshard(config, client, progress=kill_one)
        assert victim not in client.run(os.getpid).values()
    clean = run_reshard(config.model_copy(update={"output_root": str(tmp_path / "clean")}),
                        dask_client)
    assert killed and killed[0][0] < killed[0][1]  # killed with exchange tasks left
    digests = lambda r: [s.sha256 for split in ("train", "holdout")  # noqa: E731
                         for s in r.manifest.split(split).shards]
    assert result.manifest.version_id == clean.manifest.version_id
    assert digests(result) == digests(clean)
