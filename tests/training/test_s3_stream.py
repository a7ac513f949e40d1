"""Streaming a dataset version from S3 (moto's server on loopback) through fsspec."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest

from preprocessing.contract.manifest import ManifestError, read_manifest, shard_name
from preprocessing.toolbox.faults import RetryPolicy
from tests.fault_proxy import FaultyS3Proxy
from training.config import LoaderConfig
from training.data.loader import ShardStream, StreamLoader
from training.data.readahead import ReadConfig

pytestmark = pytest.mark.slow  # every test here uses the S3 fault proxy, moto's S3 server

FAST_RETRIES = RetryPolicy(attempts=4, first_delay_s=0.1, max_delay_s=0.4)


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"ballast-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("s3").mkdir(name)
    return name


def upload(local_root: str, bucket: str) -> str:
    """Copy a dataset root (versions and `_CURRENT`) to s3://bucket/ds; returns that URI."""
    fsspec.filesystem("s3").put(local_root + "/", f"{bucket}/ds/", recursive=True)
    return f"s3://{bucket}/ds"


def stream_ids(root: str, read: ReadConfig, num_workers: int = 0) -> list[int]:
    stream = ShardStream(root, "train", LoaderConfig(batch_size=8), seed=2, read=read)
    loader = StreamLoader(stream, num_workers=num_workers)
    return [i for batch in loader for i in batch["id"].tolist()]


@pytest.mark.parametrize(
    ("depth", "num_workers", "cached"), [(0, 0, False), (3, 0, False), (2, 2, False), (2, 0, True)]
)
def test_s3_version_streams_as_the_local_one(
    make_dataset: Callable[..., str],
    bucket: str,
    tmp_path: Path,
    depth: int,
    num_workers: int,
    cached: bool,
) -> None:
    """Read through `_CURRENT` on S3 by range reads (any read-ahead depth, in worker
    processes) or through the verified disk cache, the stream equals the local stream."""
    local = make_dataset(400, num_shards=3, row_group_size=16)
    remote = upload(local, bucket)
    cache = str(tmp_path / "cache") if cached else None
    read = ReadConfig(prefetch_row_groups=depth, cache_dir=cache)
    assert stream_ids(remote, read, num_workers) == stream_ids(local, ReadConfig())
    if cached:
        assert len(list((tmp_path / "cache").glob("*.parquet"))) == 3


def test_unknown_manifest_format_on_s3_names_the_uri(
    make_dataset: Callable[..., str], bucket: str
) -> None:
    """An S3 manifest of an unknown format version fails with ManifestError naming its
    s3:// URI."""
    local = make_dataset(50)
    _, location = read_manifest(local)
    raw = json.loads(Path(location).read_text())
    Path(location).write_text(json.dumps(raw | {"format_version": 7}))
    remote = upload(local, bucket)
    expected = f"{remote}/{Path(location).parent.name}/{Path(location).name}"
    with pytest.raises(ManifestError, match=rf"{re.escape(expected)}.*format_version 7"):
        ShardStream(remote, "train", LoaderConfig(batch_size=8), seed=2)


def test_shard_reads_that_fail_for_a_while_cost_retries_not_rows(
    make_dataset: Callable[..., str], bucket: str, proxy: FaultyS3Proxy
) -> None:
    """Fault: the proxy answers a shard's next 7 GETs with 503 SlowDown (more than s3fs's
    own tries) and cuts another's next 6 bodies short. Invariant: the loader's stream of
    ids equals the local one, and the faults were served (the retries did the work)."""
    local = make_dataset(400, num_shards=3, row_group_size=16)
    remote = upload(local, bucket)
    proxy.inject(f"{bucket}/ds/v-*/{shard_name('train', 0)}", "503", 7)
    proxy.inject(f"{bucket}/ds/v-*/{shard_name('train', 1)}", "truncate", 6)
    read = ReadConfig(prefetch_row_groups=0, retry=FAST_RETRIES)
    assert stream_ids(remote, read) == stream_ids(local, ReadConfig())
    assert {fault for (_, fault) in proxy.served} == {"503", "truncate"}


def test_a_shard_unreadable_on_every_try_fails_naming_the_tries(
    make_dataset: Callable[..., str], bucket: str, proxy: FaultyS3Proxy
) -> None:
    """Fault: every GET of one shard answers 503. Invariant: the stream fails (no batch
    silently short of that shard's rows) after the policy's tries, and says so."""
    remote = upload(make_dataset(400, num_shards=3, row_group_size=16), bucket)
    proxy.inject(f"{bucket}/ds/v-*/{shard_name('train', 0)}", "503", 10_000)
    with pytest.raises(OSError) as raised:
        stream_ids(remote, ReadConfig(prefetch_row_groups=0, retry=FAST_RETRIES))
    assert "try 4 of 4" in " ".join(getattr(raised.value, "__notes__", []))
