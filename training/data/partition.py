"""The order of an epoch, cut into partitions, and which rank and worker serves which rows.

An epoch (seed, epoch) is planned from the manifest alone, in four steps:

1. The split's row groups in a permuted order (`group_order`) form the *slot
   sequence*: slot s holds row group `order[s]`, its rows in file order (the
   reshard already wrote them in a random order; the window below shuffles them).
   Position x of the sequence is row x - start(s) of slot s.
2. The sequence is cut into `num_partitions` (P) contiguous spans, the partitions
   (Mosaic Streaming's canonical nodes). Their layout along the sequence is the
   digit reversal of p in the mixed radix of P's prime factors (the bit reversal
   for P = 16), so the partitions of one consumer (below) are neighbours: for
   P = 16 and any world size x workers dividing it, one consumer's rows are one
   contiguous run of row groups, and only the two row groups at its ends are
   shared with another consumer.
3. The global stream is a sequence of *units* of `batch_size` (B) rows: unit j is
   the (j // P)-th unit of partition j % P. Partition sizes follow from that: the
   units of the epoch (the last one partial) are dealt to the partitions round robin.
4. Inside a partition, the shuffle window mixes rows: offsets are cut into blocks
   of `window_rows` (shuffle_window_row_groups x the largest row group), and each
   block's rows are permuted together, so a batch takes its rows from several row
   groups of different shards. Partition p's block edges are shifted by p/P of a
   window, so the partitions open their next blocks at evenly spaced times, not
   all at once.

A global step at world size W is W consecutive units; rank r takes unit r of each.
Worker w of nw takes the rank's steps t with t % nw == w. So consumer (r, w)
serves the units j = start + r + w*W (mod W*nw), which are exactly the units of
the partitions p = that residue (mod W*nw) when W*nw divides P (`check_share`):
each consumer decodes only its partitions' row groups, about 1/(W*nw) of the
split. The stream of units does not depend on W or nw, so (epoch, samples
consumed) resumes on any world size and worker count that divides P.

`Schedule` turns one consumer's units into `Recipe`s: the rows of each batch by
(slot, row), the slots to read first (in the order a read-ahead must fetch them)
and the slots no later batch of the consumer reads (released then).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from training.config import LoaderConfig
from training.data.shards import Layout


def group_order(seed: int, epoch: int, num_groups: int) -> np.ndarray:
    """The permuted order in which an epoch visits the row groups of a split."""
    return np.random.default_rng([seed, epoch, 0, 0]).permutation(num_groups)


def check_share(num_partitions: int, world_size: int, num_workers: int) -> None:
    """Refuse a world size x worker count that does not divide the partition count: such
    consumers would each read rows of most partitions, i.e. decode most of the split."""
    consumers = world_size * max(num_workers, 1)
    if num_partitions % consumers:
        raise ValueError(
            f"loader.num_partitions ({num_partitions}) is not a multiple of world size "
            f"{world_size} x {max(num_workers, 1)} DataLoader worker(s) per rank = {consumers}: "
            "each rank's workers serve whole partitions, so that each decodes only its share. "
            f"Use a world size and num_workers whose product divides {num_partitions}, or set "
            f"loader.num_partitions to a multiple of {consumers} (it orders the epoch, so a "
            "run resumed from a checkpoint must keep the value it was saved with)."
        )


def prime_factors(number: int) -> list[int]:
    factors, divisor = [], 2
    while divisor * divisor <= number:
        while number % divisor == 0:
            factors.append(divisor)
            number //= divisor
        divisor += 1
    return factors + ([number] if number > 1 else [])


def layout_positions(num_partitions: int) -> np.ndarray:
    """Where each partition lies along the slot sequence: the digit reversal of p in the
    mixed radix of the prime factors of P, smallest first. Partitions p = r (mod m) are
    then adjacent for every m that is a product of the smallest factors (2, 4, 8 ... for 16)."""
    positions = np.zeros(num_partitions, np.int64)
    rest, scale = np.arange(num_partitions), num_partitions
    for factor in prime_factors(num_partitions):
        scale //= factor
        positions += rest % factor * scale
        rest = rest // factor
    return positions


def partition_rows(num_rows: int, batch_size: int, num_partitions: int) -> np.ndarray:
    """Rows of each partition: the epoch's units of `batch_size` rows (the last one partial)
    dealt round robin, unit j to partition j % P."""
    num_units = -(-num_rows // batch_size)
    units = num_units // num_partitions + (np.arange(num_partitions) < num_units % num_partitions)
    rows = units.astype(np.int64) * batch_size
    if num_units:
        rows[(num_units - 1) % num_partitions] -= num_units * batch_size - num_rows
    return rows


@dataclass(frozen=True)
class Recipe:
    """One batch of a consumer: its real rows by (slot, row), ascending (a batch's rows
    are a set: gathered in file order, each group's rows are read in one forward pass), as
    `runs` of (slot, begin, end): rows[begin:end] are rows of slot `slot`; then `num_pad`
    copies of the row `pad` (weight 0); the slots to read before it, in order, and those
    to release after it."""

    runs: tuple[tuple[int, int, int], ...]
    rows: np.ndarray
    num_pad: int
    pad: tuple[int, int] | None
    load: tuple[int, ...]
    free: tuple[int, ...]

    @property
    def num_real(self) -> int:
        return len(self.rows)


class EpochPlan:
    """The units, partitions and shuffle windows of one epoch; see the module docstring."""

    def __init__(self, layout: Layout, seed: int, epoch: int, config: LoaderConfig) -> None:
        self.layout, self.seed, self.epoch = layout, seed, epoch
        self.batch_size, self.num_partitions = config.batch_size, config.num_partitions
        self.order = group_order(seed, epoch, len(layout.group_rows))
        sizes = layout.group_rows[self.order]
        self.ends = np.cumsum(sizes)
        self.starts = self.ends - sizes
        self.num_rows = int(self.ends[-1]) if len(self.ends) else 0
        self.num_units = -(-self.num_rows // self.batch_size)
        self.partition_rows = partition_rows(self.num_rows, self.batch_size, self.num_partitions)
        self.by_position = np.argsort(layout_positions(self.num_partitions))
        span_ends = np.cumsum(self.partition_rows[self.by_position])
        self.partition_start = np.empty(self.num_partitions, np.int64)
        self.partition_start[self.by_position] = span_ends - self.partition_rows[self.by_position]
        largest = int(layout.group_rows.max()) if len(layout.group_rows) else 1
        self.window_rows = config.shuffle_window_row_groups * largest
        self._blocks: dict[int, dict[int, np.ndarray]] = defaultdict(dict)

    def phase(self, partition: int) -> int:
        """Where partition `partition`'s first full block starts (its blocks' shift)."""
        return partition * self.window_rows // self.num_partitions

    def block_bounds(self, partition: int, block: int) -> tuple[int, int]:
        """Offsets [lo, hi) of a block inside its partition (block 0 is the short first one)."""
        edge = (block - 1) * self.window_rows + self.phase(partition)
        return max(edge, 0), min(edge + self.window_rows, int(self.partition_rows[partition]))

    def block_order(self, partition: int, block: int) -> np.ndarray:
        """The permutation of a block's rows, computed once per consumer; a partition's
        blocks are visited in order, so those two behind the newest are dropped."""
        kept = self._blocks[partition]
        if block not in kept:
            lo, hi = self.block_bounds(partition, block)
            rng = np.random.default_rng([self.seed, self.epoch, 2, partition, block])
            kept[block] = rng.permutation(hi - lo)
            for old in [k for k in kept if k < block - 1]:
                del kept[old]
        return kept[block]

    def unit_positions(self, unit: int) -> np.ndarray:
        """Slot-sequence positions of the real rows of global unit `unit`, in stream order."""
        partition, row_unit = unit % self.num_partitions, unit // self.num_partitions
        offset = row_unit * self.batch_size
        stop = min(offset + self.batch_size, int(self.partition_rows[partition]))
        parts = [np.empty(0, np.int64)]
        while offset < stop:  # the unit's offsets ascend through one block or a few
            block = int(self.block_of(partition, offset))
            lo, hi = self.block_bounds(partition, block)
            end = min(hi, stop)
            parts.append(lo + self.block_order(partition, block)[offset - lo : end - lo])
            offset = end
        return self.partition_start[partition] + np.concatenate(parts)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slot, row within the slot's row group) of slot-sequence positions."""
        slots = np.searchsorted(self.ends, positions, side="right")
        return slots, positions - self.starts[slots]

    def pad_row(self) -> tuple[int, int]:
        """(slot, row) of the epoch's last stream position, which padding repeats."""
        last = self.unit_positions(self.num_units - 1)[-1:]
        slots, rows = self.locate(last)
        return int(slots[0]), int(rows[0])

    def block_of(self, partition: int, offsets: Any) -> Any:
        """The block of each offset inside `partition`."""
        return (offsets + self.window_rows - self.phase(partition)) // self.window_rows

    def slot_partitions(self, slot: int) -> list[tuple[int, int]]:
        """(partition, end of the slot's rows inside it) for each non-empty partition that
        holds rows of `slot`."""
        lo, hi = int(self.starts[slot]), int(self.ends[slot])
        starts = self.partition_start[self.by_position]
        ends = starts + self.partition_rows[self.by_position]
        first = int(np.searchsorted(ends, lo, side="right"))
        stop = int(np.searchsorted(starts, hi - 1, side="right"))
        found = []
        for partition in self.by_position[first:stop].tolist():
            start, size = int(self.partition_start[partition]), int(self.partition_rows[partition])
            if size:
                found.append((partition, min(hi - start, size)))
        return found

    def last_unit(self, slot: int, residue: int, modulus: int) -> int:
        """The last unit j = residue (mod modulus) that may read `slot`: over the slot's
        partitions served by those units, the last unit of the block holding its last row."""
        last = -1
        for partition, end in self.slot_partitions(slot):
            if (partition - residue) % modulus == 0:
                block_end = self.block_bounds(partition, int(self.block_of(partition, end - 1)))[1]
                unit = (block_end - 1) // self.batch_size * self.num_partitions + partition
                last = max(last, unit)
        return last


class Schedule:
    """The recipes of one consumer's units (`units`: ascending, one step apart), with
    every slot read once while any of its batches is ahead and released after its last."""

    def __init__(self, plan: EpochPlan, units: range) -> None:
        self.plan, self.units = plan, units
        self._live: set[int] = set()
        self._expiry: dict[int, list[int]] = defaultdict(list)
        self._freed_to = 0  # batches below this one have released their slots

    def __iter__(self) -> Iterator[Recipe]:
        for batch, unit in enumerate(self.units):
            yield self.recipe(batch, unit)

    def recipe(self, batch: int, unit: int) -> Recipe:
        plan = self.plan
        positions = plan.unit_positions(unit) if unit < plan.num_units else np.empty(0, np.int64)
        ascending = np.sort(positions)  # by slot, then row: positions ascend with both
        slots, rows = plan.locate(ascending)
        num_pad = plan.batch_size - len(slots)
        pad = plan.pad_row() if num_pad else None
        runs = slot_runs(slots)
        needed = [slot for slot, _, _ in runs] + ([pad[0]] if pad else [])
        load = tuple(dict.fromkeys(s for s in needed if s not in self._live))
        for slot in load:
            self._live.add(slot)
            self._expiry[max(self.last_batch(slot), batch)].append(slot)
        # A consumer that skips batches (balance: speed, training/data/balance.py) releases
        # the slots of the skipped ones here too.
        free = tuple(
            slot for done in range(self._freed_to, batch + 1) for slot in self._expiry.pop(done, ())
        )
        self._freed_to = max(self._freed_to, batch + 1)
        self._live.difference_update(free)
        return Recipe(runs, rows, num_pad, pad, load, free)

    def last_batch(self, slot: int) -> int:
        """This consumer's last batch that may read `slot` (its final batch at most)."""
        step = self.units.step if len(self.units) > 1 else 1
        last = self.plan.last_unit(slot, self.units.start, step)
        return min((last - self.units.start) // step, len(self.units) - 1)


def slot_runs(slots: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """(slot, begin, end) of each run of equal values in ascending `slots`: built once per
    batch here, so assembling the batch loops over a few runs, not over its rows."""
    cuts = [0, *(np.flatnonzero(slots[1:] != slots[:-1]) + 1).tolist(), len(slots)]
    return tuple((int(slots[begin]), begin, end) for begin, end in pairwise(cuts) if end > begin)
