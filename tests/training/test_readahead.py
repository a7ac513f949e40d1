"""Read-ahead changes when row groups are read, never what a stream yields."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.contract.manifest import read_manifest, shard_uri
from training.config import LoaderConfig
from training.data.batches import Batch
from training.data.loader import ShardStream, StreamLoader
from training.data.readahead import ReadAhead, ReadConfig, prefetched
from training.data.shards import ShardMissingError


def make_stream(root: str, batch_size: int, depth: int, remainder: str = "pad") -> ShardStream:
    """`depth` row groups read ahead and `depth` batches assembled ahead (0: on demand);
    36 partitions serve every world size x worker count the tests draw (up to 3 x 3)."""
    config = LoaderConfig(batch_size=batch_size, remainder=remainder, num_partitions=36)
    read = ReadConfig(prefetch_row_groups=depth, prefetch_batches=depth)
    return ShardStream(root, "train", config, seed=11, read=read)


def same_batches(left: list[Batch], right: list[Batch]) -> bool:
    return len(left) == len(right) and all(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        for a, b in zip(left, right, strict=True)
    )


@settings(max_examples=25, deadline=None)
@given(
    num_rows=st.integers(1, 200),
    row_group_size=st.sampled_from([3, 8, 40]),
    depth=st.integers(1, 4),
    world_size=st.integers(1, 3),
    num_workers=st.integers(1, 3),
    batch_size=st.integers(1, 9),
    epoch=st.integers(0, 2),
)
def test_read_ahead_yields_exactly_the_depth_zero_stream(
    dataset_cache: Callable[..., str],
    num_rows: int,
    row_group_size: int,
    depth: int,
    world_size: int,
    num_workers: int,
    batch_size: int,
    epoch: int,
) -> None:
    """For every rank and worker, the batches (features, labels, ids, weights) read with
    `depth` row groups ahead and assembled `depth` batches ahead equal those read and
    assembled on demand, in the same order."""
    root = dataset_cache(num_rows, num_shards=3, row_group_size=row_group_size)
    for rank in range(world_size):
        for worker in range(num_workers):
            streams = [make_stream(root, batch_size, d) for d in (0, depth)]
            for stream in streams:
                stream.set_epoch(epoch)
            got = [list(s.iterate((rank, world_size), (worker, num_workers))) for s in streams]
            assert same_batches(got[0], got[1])


@pytest.mark.slow
def test_read_ahead_through_worker_processes(dataset_cache: Callable[..., str]) -> None:
    """A StreamLoader with 2 worker processes reading 3 row groups ahead yields the batches
    a depth-0 stream yields in this process."""
    root = dataset_cache(500, num_shards=3, row_group_size=16)
    loader = StreamLoader(make_stream(root, 7, depth=3), num_workers=2)
    assert same_batches(list(loader), list(make_stream(root, 7, depth=0)))


def test_a_background_read_error_reaches_the_consumer(make_dataset: Callable[..., str]) -> None:
    """A shard that is missing when a read-ahead thread reads it fails the iteration with
    ShardMissingError naming the shard, not a hang or a silent gap."""
    root = make_dataset(120, num_shards=3, row_group_size=8)
    manifest, location = read_manifest(root)
    entry = manifest.split("train").shards[2]
    os.remove(shard_uri(location, entry))
    with pytest.raises(ShardMissingError, match=entry.path):
        list(make_stream(root, 4, depth=3))


def test_reads_run_ahead_of_the_consumer_up_to_the_depth() -> None:
    """After the first get, the next `depth` keys are read without being asked for, and
    no further: at most depth + 1 values are held."""
    started: list[int] = []
    release = threading.Event()

    def load(key: int) -> int:
        started.append(key)
        if key > 0:
            release.wait(5)
        return key * 10

    with ReadAhead(load, range(10), depth=2) as reads:
        assert reads.get(0) == 0
        deadline = time.monotonic() + 5
        while len(started) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert sorted(started) == [0, 1, 2]
        release.set()
        assert [reads.get(k) for k in (1, 1, 2, 3)] == [10, 10, 20, 30]


def test_asking_out_of_the_planned_order_is_refused() -> None:
    """Keys must be asked for in the planned order; another key raises instead of
    returning the wrong value."""
    with ReadAhead(lambda key: key, [0, 1, 2], depth=1) as reads:
        assert reads.get(0) == 0
        with pytest.raises(RuntimeError, match="asked for key 2, planned 1"):
            reads.get(2)


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "batch-prefetch" and t.is_alive()]


def test_batches_are_made_ahead_up_to_the_depth_and_closing_stops_the_thread() -> None:
    """After the first item, the producer runs ahead by `depth` items (one more may be in
    progress) and no further; closing the consumer mid-stream ends the thread and closes
    the source, so no thread or open read outlives an abandoned epoch."""
    produced: list[int] = []
    source_closed = threading.Event()

    def items() -> Iterator[int]:
        try:
            for item in itertools.count():
                produced.append(item)
                yield item
        finally:
            source_closed.set()

    stream = prefetched(items(), depth=2)
    assert next(stream) == 0
    deadline = time.monotonic() + 5
    while len(produced) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert 3 <= len(produced) <= 4, produced
    assert [next(stream), next(stream)] == [1, 2]
    stream.close()
    assert source_closed.is_set() and not prefetch_threads()
