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

from preprocessing.plan.counts import small_ints
from preprocessing.plan.permutation import (
    derive_key,
    derive_keys,
    group_runs,
    mix64,
    permute_many,
    unit_interval,
)
from preprocessing.plan.split import SplitPlan, contiguous_rows


@dataclass(frozen=True)
class Routing:
    """Where a piece's rows go: `rows` index the piece (with repeats for copies)."""

    rows: np.ndarray
    shards: np.ndarray
    order_keys: np.ndarray


def holdout_mask(
    file_key: str, first_row: int, num_rows: int, seed: int, fraction: float
) -> np.ndarray:
    """True for rows held out; a function of (seed, file, row index in file) only. The
    default draw: the scan and every route of the exchange call
    `plan.split_keys.holdout_rows`, which draws by a row's group or content instead when
    the dataset asks (docs/data-path.md), and by this otherwise."""
    if fraction <= 0:  # the draws are in [0, 1): none is below 0, and hashing costs 0.1 us/row
        return np.zeros(num_rows, dtype=bool)
    row_index = np.arange(first_row, first_row + num_rows, dtype=np.uint64)
    return unit_interval(row_index, derive_key(seed, "holdout", file_key)) < fraction


def rank_within_stratum(
    strata: np.ndarray, offsets: np.ndarray, piece_of: np.ndarray | None = None
) -> np.ndarray:
    """Within-stratum index of each row: its piece's offset of the stratum plus the row's
    rank among the piece's rows of that stratum. `offsets` is one piece's offsets, or one
    row of offsets per piece with `piece_of` each row's piece (rows in piece order)."""
    if piece_of is None:
        piece_of, offsets = np.zeros(len(strata), dtype=np.int64), offsets[None, :]
    key = piece_of * offsets.shape[1] + strata
    order = np.argsort(small_ints(key), kind="stable")
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(strata)]))
    ranks = np.empty(len(strata), dtype=np.int64)
    ranks[order] = np.arange(len(strata)) - run_start
    return offsets[piece_of, strata] + ranks


def stratum_outputs(
    strata: np.ndarray, index: np.ndarray, plan: SplitPlan, seed: int
) -> tuple[np.ndarray, np.ndarray]:
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
    output = np.where(
        copy < full_r, copy * n_r + index[source_row], full_r * n_r + permuted[source_row]
    )
    return source_row, output


def route_rows(
    strata: np.ndarray, offsets: np.ndarray, plan: SplitPlan, seed: int, piece: int = -1
) -> Routing:
    """Route the rows of one split of one piece to their shards, with in-shard order keys."""
    return route_pieces(
        strata,
        np.zeros(len(strata), dtype=np.int64),
        offsets[None, :],
        plan,
        seed,
        np.array([piece]),
    )


def route_pieces(
    strata: np.ndarray,
    piece_of: np.ndarray,
    offsets: np.ndarray,
    plan: SplitPlan,
    seed: int,
    pieces: np.ndarray,
) -> Routing:
    """Route the rows of one split of several pieces at once (a map task's): row i belongs
    to piece `pieces[piece_of[i]]`, whose stratum offsets are `offsets[piece_of[i]]`; rows
    in piece order. The same fates as one piece at a time, in one vectorised pass."""
    index = rank_within_stratum(strata, offsets, piece_of)
    if plan.piece_starts is not None:
        return route_contiguous(strata, index, piece_of, plan.piece_starts[pieces], plan, seed)
    source_row, output = stratum_outputs(strata, index, plan, seed)
    groups = plan.group_of[strata[source_row]]
    within_group = plan.offset_in_group[strata[source_row]] + output
    keys = derive_keys(len(plan.group_rows), seed, plan.name, "position")
    runs = group_runs(groups, len(plan.group_rows))
    position = permute_many(within_group, groups, plan.group_rows, keys, runs)
    shards = shards_of(position, runs, plan.shard_bounds)
    global_position = plan.group_start[groups] + position
    order_keys = mix64(global_position.astype(np.uint64), derive_key(seed, plan.name, "order"))
    return Routing(rows=source_row, shards=shards, order_keys=order_keys)


def shards_of(
    position: np.ndarray, runs: tuple[np.ndarray, np.ndarray], shard_bounds: np.ndarray
) -> np.ndarray:
    """The shard of each output row from its position in its group: `runs` lists the rows
    group by group (`group_runs`), `shard_bounds[g, s]` is the rows of group g in shards
    0..s. One search per group present."""
    order, bounds = runs
    shards = np.empty(len(position), dtype=np.int64)
    for group in np.flatnonzero(np.diff(bounds)).tolist():
        rows = order[bounds[group] : bounds[group + 1]]
        shards[rows] = np.searchsorted(shard_bounds[group], position[rows], side="right")
    return shards


def route_contiguous(
    strata: np.ndarray,
    index: np.ndarray,
    piece_of: np.ndarray,
    piece_starts: np.ndarray,
    plan: SplitPlan,
    seed: int,
) -> Routing:
    """`none` / `block` modes: systematic resampling, copies adjacent, each piece's outputs
    contiguous from its start; `block` then shuffles rows within each shard."""
    one = np.ones(len(strata), dtype=np.int64)
    copies = contiguous_rows(index, one, plan.input_rows[strata], plan.output_rows[strata])
    source_row = np.repeat(np.arange(len(strata)), copies)
    out_piece = piece_of[source_row]
    first_output = np.cumsum(np.bincount(out_piece, minlength=len(piece_starts)))
    first_output = np.r_[0, first_output[:-1]]
    position = piece_starts[out_piece] + np.arange(len(source_row)) - first_output[out_piece]
    bounds = np.cumsum(plan.shard_rows())
    shards = np.searchsorted(bounds, position, side="right")
    keys = position.astype(np.uint64)
    if plan.mode == "block":
        keys = mix64(keys, derive_key(seed, plan.name, "order"))
    return Routing(rows=source_row, shards=shards, order_keys=keys)
