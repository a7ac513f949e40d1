"""The local disk cache of shards: reused across epochs, bounded, verified, shared."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from preprocessing.contract.manifest import read_manifest, shard_uri
from training.config import LoaderConfig
from training.data.cache import ShardCache, ShardChecksumError
from training.data.loader import ShardStream, StreamLoader
from training.data.readahead import ReadConfig


def make_stream(root: str, cache_dir: Path | None, cache_bytes: int = 2**30) -> ShardStream:
    read = ReadConfig(
        prefetch_row_groups=2,
        cache_dir=str(cache_dir) if cache_dir else None,
        cache_bytes=cache_bytes,
    )
    return ShardStream(root, "train", LoaderConfig(batch_size=8), seed=4, read=read)


def epoch_ids(stream: ShardStream, epoch: int) -> list[int]:
    stream.set_epoch(epoch)
    return [i for batch in stream for i in batch["id"].tolist()]


def cache_of(stream: ShardStream) -> ShardCache:
    assert stream.files.cache is not None
    return stream.files.cache


def test_second_epoch_reads_only_from_the_cache(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """Epoch 0 downloads each shard once; with the original shards then deleted, epoch 1
    still yields exactly the uncached stream's epoch 1, downloading nothing more."""
    root = make_dataset(300, num_shards=4, row_group_size=16)
    manifest, location = read_manifest(root)
    expected = epoch_ids(make_stream(root, None), 1)
    stream = make_stream(root, tmp_path / "cache")
    epoch_ids(stream, 0)
    assert cache_of(stream).downloads == 4
    for entry in manifest.split("train").shards:
        os.remove(shard_uri(location, entry))
    assert epoch_ids(stream, 1) == expected
    assert cache_of(stream).downloads == 4 and cache_of(stream).hits > 0


def test_eviction_keeps_the_cache_under_its_byte_limit(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """With room for about two of six shards, the cached bytes never exceed the limit after
    any batch, copies are evicted, and the stream is unchanged."""
    root = make_dataset(600, num_shards=6, row_group_size=16)
    manifest, _ = read_manifest(root)
    sizes = sorted(entry.num_bytes for entry in manifest.split("train").shards)
    limit = sizes[-1] + sizes[-2]
    stream = make_stream(root, tmp_path / "cache", cache_bytes=limit)
    cache, ids = cache_of(stream), []
    for batch in stream:
        assert cache.cached_bytes() <= limit
        ids += batch["id"].tolist()
    assert ids == epoch_ids(make_stream(root, None), 0)
    assert cache.evictions > 0 and cache.downloads > 6


def test_corrupt_shard_fails_its_checksum_naming_it(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """A shard whose bytes changed (same size) is refused when it enters the cache, with
    ShardChecksumError naming the shard and both digests; nothing is left in the cache."""
    root = make_dataset(100, num_shards=2, row_group_size=16)
    manifest, location = read_manifest(root)
    entry = manifest.split("train").shards[1]
    path = Path(shard_uri(location, entry))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ShardChecksumError) as raised:
        list(make_stream(root, tmp_path / "cache"))
    message = str(raised.value)
    assert entry.path in message and entry.sha256 in message
    assert re.search(r"has sha256 [0-9a-f]{64}", message)
    assert not any(p.name.startswith(entry.sha256) for p in (tmp_path / "cache").iterdir())


def test_truncated_cached_copy_is_downloaded_again(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """A cached copy whose size no longer matches the manifest is replaced by a fresh,
    verified download, and the stream is unchanged."""
    root = make_dataset(100, num_shards=2, row_group_size=16)
    stream = make_stream(root, tmp_path / "cache")
    first = epoch_ids(stream, 0)
    copy = Path(cache_of(stream).path_of(stream.layout.entries[0]))
    copy.chmod(0o644)
    copy.write_bytes(copy.read_bytes()[:100])
    assert epoch_ids(stream, 0) == first
    assert cache_of(stream).downloads == 3
    assert copy.stat().st_size == stream.layout.entries[0].num_bytes


@pytest.mark.slow
def test_worker_processes_share_one_cache_directory(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """Two DataLoader worker processes filling and evicting one small cache directory at
    once yield the uncached stream; no temporary file is left and the limit holds."""
    root = make_dataset(600, num_shards=6, row_group_size=16)
    limit = 3 * max(e.num_bytes for e in read_manifest(root)[0].split("train").shards)
    for _ in range(2):  # the second pass finds a warm, shared cache
        loader = StreamLoader(make_stream(root, tmp_path / "cache", limit), num_workers=2)
        ids = torch.cat([batch["id"] for batch in loader]).tolist()
        assert ids == epoch_ids(make_stream(root, None), 0)
    names = [p.name for p in (tmp_path / "cache").iterdir()]
    assert not [name for name in names if ".tmp-" in name]
    assert ShardCache(str(tmp_path / "cache"), limit).cached_bytes() <= limit


def test_a_new_cache_object_reuses_copies_on_disk(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """Copies are named by checksum: a second stream (another process's view) over the same
    directory downloads nothing, even from a copy of the version at another path."""
    root = make_dataset(100, num_shards=2, row_group_size=16)
    epoch_ids(make_stream(root, tmp_path / "cache"), 0)
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    stream = make_stream(str(moved), tmp_path / "cache")
    epoch_ids(stream, 0)
    assert cache_of(stream).downloads == 0 and cache_of(stream).hits > 0


def test_a_shard_larger_than_the_cache_is_read_but_not_kept(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """With a limit below every shard's size, the stream is unchanged and the cache
    directory keeps no copy (and no temporary file)."""
    root = make_dataset(100, num_shards=2, row_group_size=16)
    stream = make_stream(root, tmp_path / "cache", cache_bytes=100)
    assert epoch_ids(stream, 0) == epoch_ids(make_stream(root, None), 0)
    assert cache_of(stream).downloads > 0
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".lock"]
