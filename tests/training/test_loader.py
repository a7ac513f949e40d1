"""ShardStream: every sample once per epoch on any world size and worker count dividing the
partition count, equal batch counts on every rank, an order that depends on (seed, epoch)
only, each rank and worker decoding only its share, and batches that mix row groups."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.contract.manifest import ManifestError, read_manifest, shard_uri
from training.config import LoaderConfig
from training.data.batches import Batch
from training.data.loader import ShardStream, StreamLoader
from training.data.shards import ShardMissingError


def round_robin(per_worker: list[list[Batch]]) -> list[Batch]:
    """The order in which DataLoader hands out its workers' batches."""
    longest = max(len(batches) for batches in per_worker)
    return [b[i] for i in range(longest) for b in per_worker if i < len(b)]


def rank_batches(
    stream: ShardStream, rank: int, world_size: int, num_workers: int = 1
) -> list[Batch]:
    """One rank's batches for the rest of the epoch, its workers simulated in this process."""
    state = stream.state_dict()
    per_worker = []
    for worker in range(num_workers):
        stream.load_state_dict(state)
        per_worker.append(list(stream.iterate((rank, world_size), (worker, num_workers))))
    return round_robin(per_worker)


def all_ranks(
    make: Callable[[], ShardStream], world_size: int, num_workers: int = 1
) -> list[list[Batch]]:
    """Every rank's batches, each rank with its own stream as in a real job."""
    return [rank_batches(make(), rank, world_size, num_workers) for rank in range(world_size)]


def global_ids(per_rank: list[list[Batch]], real_only: bool = True) -> list[int]:
    """Ids in global stream order: step by step, rank by rank within a step."""
    ids: list[int] = []
    for step in zip(*per_rank, strict=True):
        for batch in step:
            keep = (
                batch["weight"] > 0
                if real_only
                else torch.ones_like(batch["weight"], dtype=torch.bool)
            )
            ids += batch["id"][keep].tolist()
    return ids


def stream_factory(
    root: str, batch_size: int, remainder: str, seed: int = 7, **order: int
) -> Callable[[], ShardStream]:
    config = LoaderConfig(batch_size=batch_size, remainder=remainder, **order)
    return lambda: ShardStream(root, "train", config, seed)


def position(epoch: int, samples_consumed: int, rank_batches: int, batch_size: int) -> dict:
    """A stream's state: its position, and the order fields (partitions and window default)."""
    return {
        "epoch": epoch,
        "samples_consumed": samples_consumed,
        "rank_batches": rank_batches,
        "batch_size": batch_size,
        "num_partitions": 16,
        "shuffle_window_row_groups": 4,
    }


def divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


@settings(max_examples=40, deadline=None)
@given(
    num_rows=st.integers(1, 150),
    num_shards=st.integers(1, 3),
    row_group_size=st.sampled_from([3, 8, 40]),
    num_partitions=st.sampled_from([1, 2, 4, 6, 12]),
    window=st.integers(1, 3),
    split=st.data(),
    batch_size=st.integers(1, 9),
    remainder=st.sampled_from(["drop", "pad"]),
)
def test_epoch_covers_every_sample_once_on_any_world_and_workers(
    dataset_cache: Callable[..., str],
    num_rows: int,
    num_shards: int,
    row_group_size: int,
    num_partitions: int,
    window: int,
    split: st.DataObject,
    batch_size: int,
    remainder: str,
) -> None:
    """For any world size and worker count whose product divides the partition count,
    drop: the ranks' ids together are distinct, floor(N/G)*G of them; pad: each id has
    weight 1 exactly once and padding only repeats real ids. Every rank yields the same
    number of full batches, and the global order is the world-size-1 order."""
    world_size = split.draw(st.sampled_from(divisors(num_partitions)), "world_size")
    num_workers = split.draw(st.sampled_from(divisors(num_partitions // world_size)), "workers")
    root = dataset_cache(num_rows, num_shards=num_shards, row_group_size=row_group_size)
    make = stream_factory(
        root, batch_size, remainder, num_partitions=num_partitions, shuffle_window_row_groups=window
    )
    per_rank = all_ranks(make, world_size, num_workers)
    lengths = {len(batches) for batches in per_rank}
    assert lengths == {make().num_batches(world_size)}
    assert all(len(b["id"]) == batch_size for batches in per_rank for b in batches)
    ids = global_ids(per_rank)
    global_batch = world_size * batch_size
    if remainder == "drop":
        assert len(ids) == len(set(ids)) == num_rows // global_batch * global_batch
    else:
        assert sorted(ids) == list(range(num_rows))
        assert set(global_ids(per_rank, real_only=False)) <= set(range(num_rows))
    single = global_ids(all_ranks(make, 1))
    assert ids == single[: len(ids)]


def test_batches_decode_the_rows_they_name(dataset_cache: Callable[..., str]) -> None:
    """Features, label index and weight of every sample match its row in the shard files."""
    root = dataset_cache(100, row_group_size=8)
    manifest, location = read_manifest(root)
    tables = [pq.read_table(shard_uri(location, e)) for e in manifest.split("train").shards]
    rows = {r["id"]: r for t in tables for r in t.to_pylist()}
    stream = stream_factory(root, 16, "pad")()
    for batch in stream:
        assert batch["features"].dtype == torch.float32 and batch["features"].shape == (16, 16)
        assert batch["label"].dtype == batch["id"].dtype == torch.int64
        for i, sample_id in enumerate(batch["id"].tolist()):
            row = rows[sample_id]
            assert batch["label"][i].item() == manifest.classes.index(row["label"])
            assert np.allclose(batch["features"][i].numpy(), row["features"])
    assert stream.num_features == 16


def test_same_seed_same_stream_and_epochs_differ(dataset_cache: Callable[..., str]) -> None:
    """Two streams with one seed give identical batches; another epoch or seed reorders."""
    root = dataset_cache(300, row_group_size=16)
    first = [b["id"].tolist() for b in stream_factory(root, 10, "drop")()]
    again = [b["id"].tolist() for b in stream_factory(root, 10, "drop")()]
    assert first == again
    next_epoch = stream_factory(root, 10, "drop")()
    next_epoch.set_epoch(1)
    assert [b["id"].tolist() for b in next_epoch] != first
    other_seed = [b["id"].tolist() for b in stream_factory(root, 10, "drop", seed=8)()]
    assert other_seed != first


def test_exhausted_epoch_moves_to_the_next(dataset_cache: Callable[..., str]) -> None:
    """After a full pass the state is (epoch + 1, 0), and iterating again gives that epoch."""
    root = dataset_cache(300, row_group_size=16)
    stream = stream_factory(root, 10, "drop")()
    first = [b["id"].tolist() for b in stream]
    assert stream.state_dict() == position(1, 0, 0, 10)
    second = [b["id"].tolist() for b in stream]
    reference = stream_factory(root, 10, "drop")()
    reference.set_epoch(1)
    assert second == [b["id"].tolist() for b in reference] != first


def test_set_epoch_keeps_a_resumed_position(dataset_cache: Callable[..., str]) -> None:
    """set_epoch(e) inside epoch e keeps the position; set_epoch(another) starts it over."""
    stream = stream_factory(dataset_cache(300, row_group_size=16), 10, "drop")()
    stream.load_state_dict({"epoch": 2, "samples_consumed": 40})
    stream.set_epoch(2)
    assert stream.state_dict() == position(2, 40, 0, 10)
    stream.set_epoch(3)
    assert stream.state_dict() == position(3, 0, 0, 10)


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_dataloader_workers_reproduce_the_rank_order(
    dataset_cache: Callable[..., str], monkeypatch: pytest.MonkeyPatch, num_workers: int
) -> None:
    """Through a real DataLoader with k worker processes, each rank (from RANK/WORLD_SIZE)
    receives exactly the batches a single in-process iterator yields, in the same order,
    and len(loader) is that count."""
    make = stream_factory(dataset_cache(230, row_group_size=8), 6, "pad")
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = StreamLoader(make(), num_workers=num_workers)
        got = [b["id"].tolist() for b in loader]
        expected = [b["id"].tolist() for b in make().iterate((rank, 2))]
        assert got == expected and len(got) == len(make())


def test_missing_shard_is_named_when_first_read(make_dataset: Callable[..., str]) -> None:
    """Start-up reads the manifest only, so a stream over a version whose shard is gone
    still builds; the first read of that shard fails with ShardMissingError naming it."""
    root = make_dataset(60, num_shards=2)
    manifest, location = read_manifest(root)
    entry = manifest.split("train").shards[1]
    os.remove(shard_uri(location, entry))
    stream = stream_factory(root, 4, "drop")()
    assert stream.num_rows == 60
    with pytest.raises(ShardMissingError, match=entry.path):
        list(stream)
    assert not Path(shard_uri(location, entry)).exists()


def test_start_up_opens_no_shard(make_dataset: Callable[..., str]) -> None:
    """With every shard file deleted, a stream still builds from the manifest alone and
    knows its rows, features, classes and batch count."""
    root = make_dataset(100, num_shards=3, row_group_size=8, dim=5)
    manifest, location = read_manifest(root)
    for entry in manifest.split("train").shards:
        os.remove(shard_uri(location, entry))
    stream = stream_factory(root, 4, "drop")()
    assert (stream.num_rows, stream.num_features, len(stream.classes)) == (100, 5, 10)
    assert stream.num_batches(1) == 25 and len(stream.layout.group_rows) == sum(
        entry.num_row_groups for entry in manifest.split("train").shards
    )


def test_shard_disagreeing_with_manifest_is_named(make_dataset: Callable[..., str]) -> None:
    """A shard whose footer does not match its manifest entry fails when it is read,
    naming the shard."""
    root = make_dataset(60, num_shards=2)
    manifest, location = read_manifest(root)
    entry = manifest.split("train").shards[0]
    table = pq.read_table(shard_uri(location, entry))
    pq.write_table(table.slice(0, entry.num_rows - 1), shard_uri(location, entry))
    with pytest.raises(ManifestError, match=entry.path):
        list(stream_factory(root, 4, "drop")())


def test_unknown_manifest_format_is_reported_with_its_uri(make_dataset: Callable[..., str]) -> None:
    """A manifest of a format version this ballast does not read fails at construction
    with ManifestError naming the manifest's URI and the version found."""
    _, location = read_manifest(make_dataset(30))
    raw = json.loads(Path(location).read_text())
    Path(location).write_text(json.dumps(raw | {"format_version": 99}))
    with pytest.raises(ManifestError, match=rf"{re.escape(location)}.*format_version 99"):
        stream_factory(location, 4, "drop")()


def test_missing_manifest_is_reported_with_its_uri(tmp_path: Path) -> None:
    """A directory with no manifest and no _CURRENT fails with ManifestError naming it."""
    with pytest.raises(ManifestError, match=re.escape(str(tmp_path))):
        stream_factory(str(tmp_path), 4, "drop")()


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_last_batch_handed_out_ends_the_epoch(
    dataset_cache: Callable[..., str], num_workers: int
) -> None:
    """Once the last batch of an epoch is handed out, before anyone asks for more (Lightning
    knows the length and does not), the position is already the start of the next epoch."""
    stream = stream_factory(dataset_cache(300, row_group_size=16), 7, "drop")()
    loader = StreamLoader(stream, num_workers=num_workers)
    batches = iter(loader)
    for _ in range(len(loader) - 1):
        next(batches)
    last = len(loader) - 1
    assert stream.state_dict() == position(0, last * 7, last, 7)
    next(batches)
    assert stream.state_dict() == position(1, 0, 0, 7)


def test_a_batch_is_one_buffer(dataset_cache: Callable[..., str]) -> None:
    """The four tensors of a batch are views of one storage (one shared-memory segment per
    batch from a worker), with the documented shapes and dtypes."""
    batch = next(iter(stream_factory(dataset_cache(100, row_group_size=8), 16, "pad")()))
    assert len({tensor.untyped_storage().data_ptr() for tensor in batch.values()}) == 1
    shapes = {name: (tuple(t.shape), t.dtype) for name, t in batch.items()}
    assert shapes == {
        "features": ((16, 16), torch.float32),
        "label": ((16,), torch.int64),
        "id": ((16,), torch.int64),
        "weight": ((16,), torch.float32),
    }
