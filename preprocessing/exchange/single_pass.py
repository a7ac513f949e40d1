"""The single pass: every input read once, every row routed in memory, every shard
written straight away, nothing staged (the route of a reshard whose rows fit
`single_pass_bytes`: preprocessing/plan/route.py).

It is the map task and the write tasks of the staged exchange fused, and shares their
parts rather than repeating them: the rows are read and routed by `route_rows` (the map
task's reading, fates and keys), each shard's rows are put in order of the same distinct
keys and written by `write_shard` with the same settings, so its bytes are the staged
route's. It runs as one Dask task on one worker, reading pieces and writing shards with
a thread per core of the cluster (pyarrow decodes and encodes without the GIL), routing a
map task's group of pieces at a time; the worker holds the rows read (chunks as read,
small ones joined into blocks) and a slice of a shard per thread (exchange/shard_slices.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from preprocessing.config import DatasetSpec
from preprocessing.contract.manifest import ShardEntry
from preprocessing.contract.shards import write_shard
from preprocessing.exchange.shard_slices import Blocks, keyed_slices
from preprocessing.exchange.staged_rows import (
    DERIVED_SOURCE_COLUMN,
    ORDER_COLUMN,
    Destinations,
    PieceTask,
    RoutedRows,
    route_rows,
)
from preprocessing.exchange.tasks import release_encode_buffers, thread_encode_buffer
from preprocessing.plan.counts import OffsetLists, small_ints
from preprocessing.plan.key_tally import KeyCounts, merge_keys


@dataclass(frozen=True)
class SinglePass:
    """Every piece of a reshard in the map tasks' groups, each with its splits' offsets
    (`piece_group`), and every shard's (planned rows, URI), in destination order
    (`shard_jobs`)."""

    groups: list[tuple[list[PieceTask], dict[str, OffsetLists]]]
    shards: list[tuple[int, str]]


def single_pass(
    task: SinglePass,
    destinations: Destinations,
    schema: pa.Schema,
    spec: DatasetSpec,
    seed: int,
    holdout_fraction: float,
    rows_per_row_group: int,
    part_bytes: int,
    threads: int,
    block_bytes: int,
) -> tuple[list[ShardEntry], KeyCounts]:
    """Read, route and write every shard of `task` with `threads` threads, the rows held
    in blocks of about `block_bytes`; the shards' entries in destination order, and the
    rows' content tally where the exchange takes it (staged_rows.read_piece)."""
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="single-pass") as pool:
        routed = _routed(task, pool, destinations, spec, seed, holdout_fraction, block_bytes)
        blocks = Blocks.of(routed.table.to_batches(), routed.table.schema)
        counts = np.bincount(routed.targets, minlength=len(task.shards))
        bounds = np.r_[0, np.cumsum(counts)].tolist()
        settings = (rows_per_row_group, spec.label_column, spec.source_column, part_bytes)
        try:
            entries = list(
                pool.map(
                    lambda index: _write(
                        routed,
                        blocks,
                        bounds[index : index + 2],
                        task.shards[index],
                        schema,
                        settings,
                    ),
                    range(len(task.shards)),
                )
            )
            return entries, routed.keys
        finally:
            release_encode_buffers()  # the pool's threads end with the task


def _routed(
    task: SinglePass,
    pool: ThreadPoolExecutor,
    destinations: Destinations,
    spec: DatasetSpec,
    seed: int,
    holdout_fraction: float,
    block_bytes: int,
) -> RoutedRows:
    """Every group's rows routed as its map task routes them, then joined: routing a
    group at a time holds its index arrays (several int64 a row) for one group, not for
    every row at once."""
    groups = [
        route_rows(
            members,
            offsets,
            destinations,
            spec,
            seed,
            holdout_fraction,
            over=pool.map,
            block_bytes=block_bytes,
        )
        for members, offsets in task.groups
    ]
    starts = np.cumsum([0, *(group.table.num_rows for group in groups)])
    shifted = (group.picks + start for group, start in zip(groups, starts[:-1], strict=True))
    picks = np.concatenate([np.zeros(0, np.int64), *shifted])
    order = np.concatenate([np.zeros(0, np.uint64), *(group.order for group in groups)])
    targets = np.concatenate([np.zeros(0, np.int64), *(group.targets for group in groups)])
    table = pa.concat_tables([group.table for group in groups]) if groups else None
    keys = merge_keys([group.keys for group in groups])
    del groups
    by_target = np.argsort(small_ints(targets), kind="stable")
    empty = destinations.schema.remove(destinations.schema.get_field_index(ORDER_COLUMN))
    return RoutedRows(
        table if table is not None else empty.empty_table(),
        picks[by_target],
        order[by_target],
        targets[by_target],
        keys,
    )


def _write(
    routed: RoutedRows,
    blocks: Blocks,
    bounds: list[int],
    shard: tuple[int, str],
    schema: pa.Schema,
    settings: tuple[int, str, str | None, int],
) -> ShardEntry:
    """A shard's rows (`bounds`: where they are among the routed picks) in order of
    their keys, cast to the output schema and written as a write task writes them
    (exchange/tasks.py `write_shards`)."""
    (rows, uri), (first, stop) = shard, bounds
    if stop - first != rows:
        raise RuntimeError(f"{uri}: assembled {stop - first} rows, plan says {rows}")
    picks = routed.picks[first:stop][np.argsort(routed.order[first:stop])]
    row_group_rows, label, source, part_bytes = settings
    return write_shard(
        uri,
        keyed_slices(blocks, picks, schema, row_group_rows),
        row_group_rows,
        label,
        source or DERIVED_SOURCE_COLUMN,
        part_bytes,
        thread_encode_buffer(),
    )
