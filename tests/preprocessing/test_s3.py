"""Resharding from and to S3 (moto's server on loopback), and the S3 commit race."""

from __future__ import annotations

import threading
import uuid

import fsspec
import pytest

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.manifest import (
    CommitConflict,
    file_sha256,
    read_current_version,
    read_manifest,
    shard_uri,
    swap_current,
)
from preprocessing.reshard import run_reshard


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"ballast-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("s3").mkdir(name)
    return name


def test_reshard_s3_to_s3_commits_a_readable_version(tiny_raw, bucket) -> None:
    """Invariants: inputs listed by an s3:// glob; shards balanced (+-1) with checksums that
    match the stored objects; `_CURRENT` on S3 names the version; a rerun is reused."""
    fs = fsspec.filesystem("s3")
    fs.put(f"{tiny_raw}/", f"{bucket}/raw/", recursive=True)
    config = ReshardConfig(dataset=DatasetSpec(inputs=[f"s3://{bucket}/raw/*.parquet"]),
                           output_root=f"s3://{bucket}/datasets", target_shard_rows=800,
                           num_workers=1)
    result = run_reshard(config)
    manifest, location = read_manifest(f"s3://{bucket}/datasets")
    assert manifest.version_id == result.manifest.version_id
    rows = [shard.num_rows for shard in manifest.split("train").shards]
    assert len(rows) > 1 and max(rows) - min(rows) <= 1
    assert all(file_sha256(shard_uri(location, shard)) == shard.sha256
               for shard in manifest.split("train").shards)
    assert read_current_version(f"s3://{bucket}/datasets") == manifest.version_id
    assert run_reshard(config).reused


def test_two_concurrent_commits_to_one_s3_root_exactly_one_wins(bucket) -> None:
    """Invariant: racing compare-and-swaps of `_CURRENT` from the same previous state
    leave exactly one winner; every loser gets CommitConflict; `_CURRENT` names the winner."""
    root = f"s3://{bucket}/race"
    outcomes: dict[str, str] = {}
    barrier = threading.Barrier(4)

    def commit(version_id: str) -> None:
        barrier.wait()
        try:
            swap_current(root, version_id, expected=None)
            outcomes[version_id] = "won"
        except CommitConflict:
            outcomes[version_id] = "lost"

    threads = [threading.Thread(target=commit, args=(f"v{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [v for v, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == 4 and len(winners) == 1
    assert read_current_version(root) == winners[0]
