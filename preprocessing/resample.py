"""Row fates: which input rows are held out, how often each is copied, and where it lands.

Pure numpy over one piece's rows. A row's fate depends only on the seed and its
index (within its file for the holdout draw, within its stratum for resampling),
so the output is identical however the input is split into Dask tasks.
Contiguous modes (`none`, `block`) use systematic instead of permuted selection
(see `plan.contiguous_rows`) so that every piece's output size is known upfront.

Resampling a stratum of `n` input rows to `k` output rows: every row gets
`k // n` copies, and one more when `perm_n(i) < k % n`; copy `c < k // n` of row
`i` becomes stratum output `c * n + i`, the extra copy `(k // n) * n + perm_n(i)`,
a bijection onto `[0, k)`. Output `j` of a stratum is output `offset + j` of its
group (its class in stratified mode, everything in global mode); a keyed
permutation of the group's outputs gives its position, and the plan's shard
allocation turns the position into a shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from preprocessing.permutation import (
    derive_key,
    derive_keys,
    mix64,
    permute_many,
    unit_interval,
)
from preprocessing.plan import SplitPlan, contiguous_rows


@dataclass(frozen=True)
class Routing:
    """Where a piece's rows go: `rows` index the piece (with repeats for copies)."""

    rows: np.ndarray
    shards: np.ndarray
    order_keys: np.ndarray


def holdout_mask(file_key: str, first_row: int, num_rows: int, seed: int,
                 fraction: float) -> np.ndarray:
    """True for rows held out; a function of (seed, file, row index in file) only."""
    row_index = np.arange(first_row, first_row + num_rows, dtype=np.uint64)
    return unit_interval(row_index, derive_key(seed, "holdout", file_key)) < fraction


def small_ints(values: np.ndarray) -> np.ndarray:
    """`values` as uint16 when they fit: numpy's stable sort is then a radix sort, several
    times faster than the merge sort it uses for 64-bit integers."""
    if len(values) and values.min() >= 0 and values.max() < 1 << 16:
        return values.astype(np.uint16)
    return values


def rank_within_stratum(strata: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Within-stratum index of each row: the piece's offset plus its rank among its stratum."""
    order = np.argsort(small_ints(strata), kind="stable")
    sorted_strata = strata[order]
    starts = np.flatnonzero(np.r_[True, sorted_strata[1:] != sorted_strata[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(strata)]))
    ranks = np.empty(len(strata), dtype=np.int64)
    ranks[order] = np.arange(len(strata)) - run_start
    return offsets[strata] + ranks


def stratum_outputs(strata: np.ndarray, index: np.ndarray, plan: SplitPlan,
                    seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(row repeat index, stratum output index) of every output copy of every row."""
    n = plan.input_rows[strata]
    k = plan.output_rows[strata]
    full, rest = k // n, k % n
    keys = derive_keys(len(plan.strata), seed, plan.name, "resample")
    permuted = permute_many(index, strata, plan.input_rows, keys)
    copies = full + (permuted < rest)
    source_row = np.repeat(np.arange(len(strata)), copies)
    copy = np.arange(len(source_row)) - np.repeat(np.cumsum(copies) - copies, copies)
    full_r, n_r = full[source_row], n[source_row]
    output = np.where(copy < full_r, copy * n_r + index[source_row],
                      full_r * n_r + permuted[source_row])
    return source_row, output


def route_rows(strata: np.ndarray, offsets: np.ndarray, plan: SplitPlan, seed: int,
               piece: int = -1) -> Routing:
    """Route the rows of one split of one piece to their shards, with in-shard order keys."""
    if plan.piece_starts is not None:
        return route_contiguous(strata, offsets, plan, seed, plan.piece_starts[piece])
    index = rank_within_stratum(strata, offsets)
    source_row, output = stratum_outputs(strata, index, plan, seed)
    groups = plan.group_of[strata[source_row]]
    within_group = plan.offset_in_group[strata[source_row]] + output
    keys = derive_keys(len(plan.group_rows), seed, plan.name, "position")
    position = permute_many(within_group, groups, plan.group_rows, keys)
    shards = np.empty(len(output), dtype=np.int64)
    cumulative = np.cumsum(plan.shard_alloc, axis=0)
    for group in np.unique(groups):  # one searchsorted per class present: few
        members = groups == group
        shards[members] = np.searchsorted(cumulative[:, group], position[members], side="right")
    global_position = plan.group_start[groups] + position
    order_keys = mix64(global_position.astype(np.uint64), derive_key(seed, plan.name, "order"))
    return Routing(rows=source_row, shards=shards, order_keys=order_keys)


def route_contiguous(strata: np.ndarray, offsets: np.ndarray, plan: SplitPlan, seed: int,
                     piece_start: int) -> Routing:
    """`none` / `block` modes: systematic resampling, copies adjacent, the piece's outputs
    contiguous from `piece_start`; `block` then shuffles rows within each shard."""
    index = rank_within_stratum(strata, offsets)
    one = np.ones(len(strata), dtype=np.int64)
    copies = contiguous_rows(index, one, plan.input_rows[strata], plan.output_rows[strata])
    source_row = np.repeat(np.arange(len(strata)), copies)
    position = piece_start + np.arange(len(source_row), dtype=np.int64)
    bounds = np.cumsum(plan.shard_rows())
    shards = np.searchsorted(bounds, position, side="right")
    keys = position.astype(np.uint64)
    if plan.mode == "block":
        keys = mix64(keys, derive_key(seed, plan.name, "order"))
    return Routing(rows=source_row, shards=shards, order_keys=keys)
