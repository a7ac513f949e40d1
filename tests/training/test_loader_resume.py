"""Resuming a ShardStream from its state_dict, with another world size or worker count
(dividing the partition count), continues the same global stream: no sample lost, none
repeated."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

from training.config import LoaderConfig
from training.data.batches import Batch
from training.data.loader import ShardStream, StreamLoader


def real_ids(batches: list[Batch]) -> list[int]:
    return [i for b in batches for i in b["id"][b["weight"] > 0].tolist()]


def global_order(per_rank: list[list[Batch]]) -> list[Batch]:
    """Batches step by step, rank by rank within a step: the global stream."""
    return [batch for step in zip(*per_rank, strict=True) for batch in step]


def make_streams(root: str, remainder: str, world_size: int) -> list[ShardStream]:
    config = LoaderConfig(batch_size=5, remainder=remainder, num_partitions=12)
    return [ShardStream(root, "train", config, seed=3) for _ in range(world_size)]


@pytest.mark.parametrize("remainder", ["drop", "pad"])
@pytest.mark.parametrize(("new_world", "epoch"), [(3, 0), (1, 0), (3, 2)])
def test_resume_with_another_world_size_continues_the_stream(
    dataset_cache: Callable[..., str], remainder: str, new_world: int, epoch: int
) -> None:
    """k global steps on 2 ranks, then the saved state on `new_world` ranks: the ids in
    global order equal the uninterrupted single-rank stream's (all of it with pad; a
    prefix with drop, since the dropped remainder depends on the global batch)."""
    root = dataset_cache(257, num_shards=3, row_group_size=16)
    first = make_streams(root, remainder, 2)
    for stream in first:
        stream.set_epoch(epoch)
    k = 7
    head = [list(itertools.islice(s.iterate((r, 2)), k)) for r, s in enumerate(first)]
    states = [stream.state_dict() for stream in first]
    position = {"epoch": epoch, "samples_consumed": k * 2 * 5, "rank_batches": k}
    order = {"batch_size": 5, "num_partitions": 12, "shuffle_window_row_groups": 4}
    assert states == [position | order] * 2
    second = make_streams(root, remainder, new_world)
    for stream in second:
        stream.load_state_dict(states[0])
        stream.set_epoch(epoch)  # as the Trainer's epoch-start callback does: keeps the position
    tail = [list(s.iterate((r, new_world))) for r, s in enumerate(second)]
    resumed = real_ids(global_order(head)) + real_ids(global_order(tail))
    uninterrupted = make_streams(root, remainder, 1)[0]
    uninterrupted.set_epoch(epoch)
    reference = real_ids(list(uninterrupted.iterate((0, 1))))
    assert len(set(resumed)) == len(resumed)
    if remainder == "pad":
        assert resumed == reference and sorted(resumed) == list(range(257))
    else:
        assert resumed == reference[: len(resumed)]
        assert len(reference) - len(resumed) < new_world * 5


@pytest.mark.slow
def test_loader_with_workers_records_position_and_resumes(
    dataset_cache: Callable[..., str],
) -> None:
    """A StreamLoader with worker processes records how far it handed batches out; a new
    loader (other worker count) resumed from that state yields exactly the rest."""
    root = dataset_cache(257, num_shards=3, row_group_size=16)
    config = LoaderConfig(batch_size=5, remainder="pad")
    loader = StreamLoader(ShardStream(root, "train", config, seed=3), num_workers=2)
    head = list(itertools.islice(iter(loader), 9))
    state = loader.state_dict()
    assert state == {
        "epoch": 0,
        "samples_consumed": 45,
        "rank_batches": 9,
        "batch_size": 5,
        "num_partitions": 16,
        "shuffle_window_row_groups": 4,
    }
    resumed = StreamLoader(ShardStream(root, "train", config, seed=3), num_workers=0)
    resumed.load_state_dict(state)
    tail = list(resumed)
    reference = list(ShardStream(root, "train", config, seed=3))
    assert torch.equal(
        torch.cat([b["id"] for b in head + tail]), torch.cat([b["id"] for b in reference])
    )
    assert resumed.state_dict() == state | {"epoch": 1, "samples_consumed": 0, "rank_batches": 0}
