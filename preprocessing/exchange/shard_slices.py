"""A shard's rows taken in keyed order a slice at a time, from the blocks that hold them.

Both routes end here: a write task holds a shard's staged batches (exchange/tasks.py),
the single pass holds every routed row (exchange/single_pass.py). Taking the whole shard
in order, then writing it, held it twice more beside its blocks: its taken parts joined
into one chunk, and that chunk put in order (at 8 GB, 330 MB shards: about 4x a shard in
a worker, benchmarks/RESULTS.md M70). Here the shard's rows are taken a slice of whole
row groups at a time and encoded as they come (`contract/shards.py ShardSlices`), so a
writer holds one slice beside its blocks. The bytes are the same: a shard's bytes follow
its row groups, and each slice is whole row groups in one chunk.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pyarrow as pa

from preprocessing.contract.shards import ShardSlices

# A slice's Arrow bytes, about: large enough that a slice's take from each block costs
# little beside its rows (a block's take is a few microseconds), small beside a shard.
# 8 MiB against 32 MiB took 0.12 GB off a write task's peak with 350 MB shards (M74).
SLICE_BYTES = 8 << 20


@dataclass(frozen=True)
class Blocks:
    """Rows as record batches (zero-copy), and each one's first row."""

    batches: list[pa.RecordBatch]
    starts: np.ndarray  # and the number of rows last
    schema: pa.Schema

    @classmethod
    def of(cls, batches: list[pa.RecordBatch], schema: pa.Schema) -> Blocks:
        return cls(batches, np.cumsum([0, *(batch.num_rows for batch in batches)]), schema)

    @property
    def nbytes(self) -> int:
        return sum(batch.nbytes for batch in self.batches)

    def take(self, picks: np.ndarray) -> pa.Table:
        """Rows `picks` in that order, in one chunk: taken from each block its rows in
        ascending order, then put in the order asked (a take over many chunks at once
        joins them all first: benchmarks/RESULTS.md M57)."""
        ascending = np.argsort(picks, kind="stable")
        rows = picks[ascending]
        cuts = np.searchsorted(rows, self.starts).tolist()
        parts = [
            self.batches[block].take(pa.array(rows[first:stop] - self.starts[block]))
            for block, (first, stop) in enumerate(pairwise(cuts))
            if stop > first
        ]
        taken = pa.Table.from_batches(parts, schema=self.schema).combine_chunks()
        del parts  # a slice held twice at most, not three times
        back = np.empty_like(ascending)
        back[ascending] = np.arange(len(ascending))
        return taken.take(pa.array(back)).combine_chunks()


def keyed_slices(
    blocks: Blocks, picks: np.ndarray, schema: pa.Schema, rows_per_row_group: int
) -> ShardSlices:
    """The shard whose rows are `picks` of `blocks`, in that order, cast to `schema`, as
    slices of whole row groups of about SLICE_BYTES (the last one shorter)."""
    row_bytes = blocks.nbytes / max(1, blocks.starts[-1])
    groups = max(1, int(SLICE_BYTES / max(1.0, row_bytes * rows_per_row_group)))
    step = groups * rows_per_row_group

    def make() -> Iterator[pa.Table]:
        for first in range(0, len(picks), step):
            yield blocks.take(picks[first : first + step]).cast(schema)

    return ShardSlices(schema, int(row_bytes * len(picks)), make)
