"""Partitions and shuffle windows: each rank and worker decodes only its share of the split,
counts the partitions cannot serve are refused with an error naming the setting, a resumed
position keeps its order, and a batch mixes rows of several row groups and shards."""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

import numpy as np
import pytest

from training.config import LoaderConfig
from training.data.loader import ShardStream, StreamLoader

ROW_GROUP = 16


def make_stream(root: str, batch_size: int = 8, **order: int) -> ShardStream:
    return ShardStream(root, "train", LoaderConfig(batch_size=batch_size, **order), seed=9)


@pytest.mark.parametrize(
    ("world_size", "num_workers"), [(1, 1), (2, 1), (4, 1), (2, 2), (4, 4), (16, 1)]
)
def test_each_rank_and_worker_decodes_only_its_share(
    dataset_cache: Callable[..., str], world_size: int, num_workers: int
) -> None:
    """Every consumer (rank x worker, C of them) decodes at most N/C rows plus the two row
    groups at the ends of its run of partitions, and together they serve every row."""
    num_rows = 2048
    root = dataset_cache(num_rows, num_shards=4, row_group_size=ROW_GROUP)
    consumers = world_size * num_workers
    served: list[int] = []
    for rank in range(world_size):
        for worker in range(num_workers):
            stream = make_stream(root, remainder="pad", shuffle_window_row_groups=2)
            batches = list(stream.iterate((rank, world_size), (worker, num_workers)))
            real = [i for b in batches for i in b["id"][b["weight"] > 0].tolist()]
            served += real
            assert len(real) <= stream.rows_decoded <= num_rows / consumers + 2 * ROW_GROUP
    assert sorted(served) == list(range(num_rows))


def test_counts_the_partitions_cannot_serve_are_refused(
    dataset_cache: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A world size, or world size x workers, that does not divide num_partitions fails
    with an error naming loader.num_partitions and the counts: before training (the batch
    count), in a simulated worker, and in the rank's process of a StreamLoader."""
    stream = make_stream(dataset_cache(200, row_group_size=ROW_GROUP))
    with pytest.raises(ValueError, match=r"num_partitions \(16\).*world size 3 x 1"):
        stream.num_batches(3)
    with pytest.raises(ValueError, match=r"world size 2 x 3 DataLoader"):
        next(stream.iterate((0, 2), (0, 3)))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"multiple of 6"):
        iter(StreamLoader(stream, num_workers=3))


def test_a_position_saved_under_another_order_is_refused(
    dataset_cache: Callable[..., str],
) -> None:
    """A state saved with other order fields, or off a batch boundary, is refused: resuming
    it would skip and repeat samples of its epoch. The same fields load."""
    root = dataset_cache(200, row_group_size=ROW_GROUP)
    saved = make_stream(root, num_partitions=8).state_dict() | {"samples_consumed": 16}
    with pytest.raises(ValueError, match=r"loader.num_partitions=8.*this run has 16"):
        make_stream(root).load_state_dict(saved)
    with pytest.raises(ValueError, match=r"loader.batch_size=8.*this run has 4"):
        make_stream(root, batch_size=4, num_partitions=8).load_state_dict(saved)
    with pytest.raises(ValueError, match=r"samples_consumed 12 .* multiple of loader.batch_size 8"):
        make_stream(root, num_partitions=8).load_state_dict(saved | {"samples_consumed": 12})
    resumed = make_stream(root, num_partitions=8)
    resumed.load_state_dict(saved)
    assert resumed.state_dict() == saved


def epoch_batches(root: str, window: int, epoch: int, batch_size: int = 8) -> list[np.ndarray]:
    stream = make_stream(root, batch_size, shuffle_window_row_groups=window)
    stream.set_epoch(epoch)
    return [batch["id"].numpy() for batch in stream]


def group_and_shard(root: str) -> tuple[np.ndarray, np.ndarray]:
    """Row group and shard of every id (the test data's ids count rows in shard order)."""
    layout = make_stream(root).layout
    group = np.repeat(np.arange(len(layout.group_rows)), layout.group_rows)
    return group, layout.group_shard[group]


def test_a_batch_mixes_row_groups_of_several_shards(dataset_cache: Callable[..., str]) -> None:
    """With a window of 4 row groups, a batch of 32 takes well under half its rows from one
    row group (one row group gives most of them with a window of 1), and nearly every batch
    mixes rows of two shards or more."""
    root = dataset_cache(4096, num_shards=4, row_group_size=32)
    group, shard = group_and_shard(root)

    def top_group_share(window: int) -> float:
        batches = epoch_batches(root, window, 0, batch_size=32)
        return float(np.mean([np.bincount(group[ids]).max() / len(ids) for ids in batches]))

    mixed, single = top_group_share(4), top_group_share(1)
    assert mixed <= 0.45 and single >= 0.6, (mixed, single)
    one_shard = [len(np.unique(shard[ids])) == 1 for ids in epoch_batches(root, 4, 0, 32)]
    assert np.mean(one_shard) < 0.1


def remeet_rate(root: str, window: int) -> float:
    """Of the pairs of rows that share a batch in epoch 0, the fraction sharing one in epoch 1."""
    batch_of = np.empty(4096, np.int64)
    for index, ids in enumerate(epoch_batches(root, window, 1)):
        batch_of[ids] = index
    pairs = [(a, b) for ids in epoch_batches(root, window, 0) for a, b in combinations(ids, 2)]
    return float(np.mean([batch_of[a] == batch_of[b] for a, b in pairs]))


def test_rows_that_meet_in_one_epoch_part_in_the_next(dataset_cache: Callable[..., str]) -> None:
    """Rows that shared a batch share one in the next epoch far less often with a window of
    4 row groups than with 1 (where rows of one row group keep meeting)."""
    root = dataset_cache(4096, num_shards=4, row_group_size=32)
    mixed, single = remeet_rate(root, 4), remeet_rate(root, 1)
    assert mixed * 3 < single, (mixed, single)
