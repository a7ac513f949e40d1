"""The exchange's layout: every destination's rows arrive from every map task exactly once,
within the fan-in, with round sizes that do not grow with pieces x destinations."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.exchange.tasks import default_fan_in
from preprocessing.plan.layout import (
    LOCAL_DEFAULT_FAN_IN,
    ExchangeLayout,
    group_pieces,
    merge_rounds_needed,
    plan_exchange,
)


def map_tasks_reaching(layout: ExchangeLayout, destination: int) -> Counter[int]:
    """Map task of every path from the write of `destination` back to round 0."""
    frontier = Counter(layout.write_inputs(destination))
    for index in range(len(layout.rounds) - 1, 0, -1):
        previous: Counter[int] = Counter()
        for task, paths in frontier.items():
            this = layout.rounds[index]
            low, high = this.block_bounds[task % this.num_blocks : task % this.num_blocks + 2]
            assert low <= destination < high, "a merge task reads a block without the row"
            for item in layout.merge_inputs(index, task):
                previous[item] += paths
        frontier = previous
    return frontier


@settings(max_examples=150, deadline=None)
@given(
    num_maps=st.integers(1, 70),
    num_destinations=st.integers(1, 90),
    fan_in=st.integers(2, 6),
    rounds=st.one_of(st.none(), st.integers(1, 4)),
)
def test_every_destination_gets_every_map_output_once_within_the_fan_in(
    num_maps: int, num_destinations: int, fan_in: int, rounds: int | None
) -> None:
    """Invariants: following the reads back from any destination's write reaches every map
    task exactly once (no row lost or read twice); merge tasks read at most `fan_in`
    objects; with rounds chosen, writes do too; a merge round has at most
    maps + blocks tasks; write tasks cover the destinations in runs that each lie inside
    one block of the last round."""
    layout = plan_exchange(
        np.ones(num_maps), np.ones(num_destinations), task_bytes=1, fan_in=fan_in, rounds=rounds
    )
    assert layout.num_map_tasks == num_maps
    for destination in range(num_destinations):
        assert map_tasks_reaching(layout, destination) == Counter(range(num_maps))
    for index in range(1, len(layout.rounds)):
        this = layout.rounds[index]
        assert this.num_objects <= num_maps + this.num_blocks
        assert all(
            len(layout.merge_inputs(index, task)) <= fan_in for task in range(this.num_objects)
        )
    if rounds is None:
        assert all(len(layout.write_inputs(d)) <= fan_in for d in range(num_destinations))
        assert layout.num_read_rounds == 1 + merge_rounds_needed(num_maps, fan_in)
    writes, last = layout.write_bounds, layout.rounds[-1]
    assert writes[0] == 0 and writes[-1] == num_destinations and (np.diff(writes) > 0).all()
    assert all(
        last.block_of(first) == last.block_of(stop - 1)  # one block: one range each
        for first, stop in pairwise(writes.tolist())
    )


def test_one_round_when_the_map_outputs_fit_the_fan_in() -> None:
    """Invariant: few map tasks mean today's path: writes read the map outputs directly;
    many mean merge rounds, log_F(maps) of them."""
    few = plan_exchange(np.full(10, 1e6), np.ones(2_000), task_bytes=1, fan_in=16)
    assert few.num_read_rounds == 1 and len(few.write_inputs(1_999)) == 10
    many = plan_exchange(np.full(5_000, 1e6), np.ones(2_000), task_bytes=1, fan_in=16)
    assert many.num_read_rounds == 1 + 3  # 5000 -> 313 -> 20 -> 2 objects per shard
    assert len(many.write_inputs(0)) == 2


def test_default_fan_in_keeps_merge_reads_large() -> None:
    """Invariant: the default fan-in is task bytes / 1 MiB within [2, 64]; given rounds,
    the smallest fan-in that reaches at most that many objects per write in them."""
    assert plan_exchange(np.ones(4), np.ones(8), task_bytes=32 << 20).fan_in == 32
    assert plan_exchange(np.ones(4), np.ones(8), task_bytes=1 << 30).fan_in == 64
    assert plan_exchange(np.ones(4), np.ones(8), task_bytes=1 << 10).fan_in == 2
    assert plan_exchange(np.ones(100), np.ones(8), task_bytes=1, rounds=2).fan_in == 10


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 1_000), min_size=1, max_size=60),
    task_bytes=st.integers(1, 5_000),
    min_tasks=st.integers(1, 8),
)
def test_pieces_group_consecutively_by_bytes(
    sizes: list[int], task_bytes: int, min_tasks: int
) -> None:
    """Invariants: groups are consecutive, non-empty and cover every piece once; their
    number is min(pieces, max(min_tasks, ceil(total / task_bytes))); none holds more than
    its share plus one piece."""
    bounds = group_pieces(np.array(sizes), task_bytes, min_tasks)
    total = sum(sizes)
    expected = min(len(sizes), max(min_tasks, -(-total // task_bytes)))
    assert bounds[0] == 0 and bounds[-1] == len(sizes) and (np.diff(bounds) > 0).all()
    assert len(bounds) - 1 == expected
    share = total / expected
    for start, stop in pairwise(bounds):
        assert sum(sizes[start:stop]) <= share + max(sizes[start:stop])


def test_local_staging_reads_every_map_object_without_a_merge_round(tmp_path) -> None:
    """Invariants: unset, the fan-in is LOCAL_DEFAULT_FAN_IN under a local output root (a read is a
    memory map, a merge round a copy of every row) and the object-store default under
    s3:// (None: task bytes / 1 MiB, within 2-64); a configured fan-in is kept either way;
    so 125 map objects take one read round locally and two on S3."""

    def config(root: str, **fields: object) -> ReshardConfig:
        return ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tmp_path / "raw")]), output_root=root, **fields
        )

    assert default_fan_in(config(str(tmp_path / "out"))) == LOCAL_DEFAULT_FAN_IN
    assert default_fan_in(config("s3://bucket/out")) is None
    assert default_fan_in(config(str(tmp_path / "out"), exchange_fan_in=3)) == 3
    assert default_fan_in(config("s3://bucket/out", exchange_fan_in=3)) == 3
    local = plan_exchange(np.ones(125), np.ones(10), task_bytes=1, fan_in=LOCAL_DEFAULT_FAN_IN)
    remote = plan_exchange(np.full(125, 64 << 20), np.ones(10), task_bytes=64 << 20)
    assert (len(local.rounds), len(remote.rounds)) == (1, 2)
