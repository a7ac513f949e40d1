"""Planning a reshard: a pure function from scanned counts to exact output layout (no I/O).

Input: row counts per (piece, split, class, source) (`preprocessing/plan/counts.py`), where
a piece is one row group of one input file in global order. Output, per split: the exact number of
output rows of every stratum (a (class, source) pair), how many shards there
are and how many rows of each class group every shard receives, and for every
piece the within-stratum offset of its first row. Cost is O(count records +
strata x shards), independent of the number of rows.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from preprocessing.config import MixConfig
from preprocessing.plan.counts import SPLITS, Counts, PieceOffsets, SplitCounts, piece_offsets
from preprocessing.plan.permutation import derive_key, mix64

SHUFFLE_MODES = ("stratified", "global", "block", "none")
CONTIGUOUS_MODES = ("block", "none")


@dataclass(frozen=True)
class SplitPlan:
    """The exact layout of one split; arrays are indexed by stratum, group or shard."""

    name: str
    strata: list[tuple[Any, Any]]
    input_rows: np.ndarray
    output_rows: np.ndarray
    group_of: np.ndarray
    offset_in_group: np.ndarray
    group_rows: np.ndarray
    group_start: np.ndarray
    shard_alloc: np.ndarray  # [num_shards, num_groups]
    piece_offsets: PieceOffsets
    mode: str = "stratified"
    # Contiguous modes only: first output position of each piece (0 for a piece without
    # rows of the split).
    piece_starts: np.ndarray | None = None

    @property
    def num_shards(self) -> int:
        return int(self.shard_alloc.shape[0])

    @property
    def num_output_rows(self) -> int:
        return int(self.output_rows.sum())

    def shard_rows(self) -> np.ndarray:
        return np.asarray(self.shard_alloc.sum(axis=1))

    @cached_property
    def shard_bounds(self) -> np.ndarray:
        """[group, shard]: rows of the group in shards 0..shard, each group's row
        contiguous. Made once per process that holds the plan (a worker keeps the shared
        plan for all its map tasks), not once per map task: O(shards x groups) each."""
        return np.ascontiguousarray(np.cumsum(self.shard_alloc, axis=0).T)


def apportion(total: int, fractions: np.ndarray) -> np.ndarray:
    """Integers summing to `total`, proportional to `fractions` (largest remainder, stable)."""
    if total == 0 or fractions.sum() == 0:
        return np.zeros(len(fractions), dtype=np.int64)
    exact = fractions / fractions.sum() * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    order = np.lexsort((np.arange(len(exact)), -(exact - counts)))
    counts[order[:short]] += 1
    return counts


def class_weights(class_rows: dict[Any, int], mix: MixConfig) -> dict[Any, float]:
    """Relative target weight of each class present in the training split."""
    if mix.class_weighting == "uniform":
        return {label: 1.0 for label in class_rows}
    if mix.class_weighting == "natural":
        return {label: float(n) for label, n in class_rows.items()}
    if mix.class_weighting == "temperature":
        return {label: float(n) ** (1.0 / mix.temperature) for label, n in class_rows.items()}
    weights = mix.class_weights or {}
    missing = [str(label) for label in class_rows if str(label) not in weights]
    if missing:
        raise ValueError(f"mix.class_weights has no weight for classes {missing}")
    return {label: float(weights[str(label)]) for label in class_rows}


def source_fraction(
    stratum_rows: int, class_rows: int, num_sources: int, source: Any, mix: MixConfig
) -> float:
    """Share of a class's output given to one of its sources."""
    if mix.source_weighting == "natural":
        return stratum_rows / class_rows
    if mix.source_weighting == "uniform":
        return 1.0 / num_sources
    weights = mix.source_weights or {}
    if str(source) not in weights:
        raise ValueError(f"mix.source_weights has no weight for source {source!r}")
    return float(weights[str(source)])


def target_fractions(
    strata: list[tuple[Any, Any]], input_rows: np.ndarray, mix: MixConfig
) -> np.ndarray:
    """Target share of the output for every stratum, from the class and source mix."""
    class_rows: dict[Any, int] = defaultdict(int)
    sources_of: dict[Any, int] = defaultdict(int)
    for (label, _), n in zip(strata, input_rows, strict=True):
        class_rows[label] += int(n)
        sources_of[label] += 1
    weights = class_weights(class_rows, mix)
    raw = [
        source_fraction(int(n), class_rows[label], sources_of[label], source, mix)
        for (label, source), n in zip(strata, input_rows, strict=True)
    ]
    within = np.array(raw, dtype=np.float64)
    labels = [label for label, _ in strata]
    within_sums: dict[Any, float] = defaultdict(float)
    for label, share in zip(labels, within, strict=True):
        within_sums[label] += share
    total_weight = sum(weights.values())
    return np.array(
        [
            weights[label] / total_weight * share / within_sums[label]
            if within_sums[label]
            else 0.0
            for label, share in zip(labels, within, strict=True)
        ]
    )


def capped_apportion(total: int, fractions: np.ndarray, caps: np.ndarray | None) -> np.ndarray:
    """`apportion` where no share exceeds its cap; capped shares give the excess to others."""
    if caps is None:
        return apportion(total, fractions)
    capped = np.zeros(len(fractions), dtype=bool)
    while True:
        free = np.where(capped, 0.0, fractions)
        counts = np.where(capped, caps, 0) + apportion(total - int(caps[capped].sum()), free)
        over = (counts > caps) & ~capped
        if not over.any():
            return counts
        capped |= over


def stratum_targets(
    total: int,
    fractions: np.ndarray,
    input_rows: np.ndarray,
    classes: np.ndarray,
    max_oversample: float | None,
) -> np.ndarray:
    """Exact output rows per stratum: the total is split over classes first (so classes
    of equal weight get equal rows, +-1), then each class's rows over its sources."""
    caps = None if max_oversample is None else np.floor(input_rows * max_oversample)
    class_ids, class_of = np.unique(classes, return_inverse=True)
    class_fractions = np.bincount(class_of, weights=fractions, minlength=len(class_ids))
    class_caps = None if caps is None else np.bincount(class_of, weights=caps).astype(np.int64)
    class_rows = capped_apportion(total, class_fractions, class_caps)
    counts = np.zeros(len(fractions), dtype=np.int64)
    for index, rows in enumerate(class_rows):
        members = np.flatnonzero(class_of == index)
        member_caps = None if caps is None else caps[members].astype(np.int64)
        counts[members] = capped_apportion(int(rows), fractions[members], member_caps)
    return counts


def allocate_shards(group_rows: np.ndarray, num_shards: int) -> np.ndarray:
    """Rows of each group per shard: floor or ceil of rows/num_shards, and every shard
    gets total//num_shards or one more row (extras are dealt round robin across groups)."""
    alloc = np.tile(group_rows // num_shards, (num_shards, 1))
    extras = group_rows % num_shards
    starts = np.cumsum(extras) - extras
    for group, (start, count) in enumerate(zip(starts, extras, strict=True)):
        alloc[(start + np.arange(count)) % num_shards, group] += 1
    return alloc


def contiguous_rows(first: Any, count: Any, n: Any, k: Any) -> Any:
    """Output rows of stratum rows [first, first + count) under systematic resampling.

    Contiguous modes copy each row `k // n` times plus once more when
    `floor((i + 1) * r / n) > floor(i * r / n)` (r = k % n): evenly spaced, exact, and
    countable over any index range in O(1), so the plan knows every piece's output size.
    """
    rest = k % n
    return (k // n) * count + (first + count) * rest // n - first * rest // n


def piece_starts(
    counts: SplitCounts,
    input_rows: np.ndarray,
    output_rows: np.ndarray,
    offsets: PieceOffsets,
    shuffled: bool,
    seed_key: int,
) -> np.ndarray:
    """First output position of every piece, pieces in input order or in keyed random
    order (0 for a piece without rows of the split)."""
    sizes = contiguous_rows(
        offsets.offsets, counts.num_rows, input_rows[counts.stratum], output_rows[counts.stratum]
    )
    present = np.unique(counts.piece)
    first_record = np.searchsorted(counts.piece, present)
    piece_sizes = np.add.reduceat(sizes, first_record) if len(sizes) else sizes
    order = np.arange(len(present))
    if shuffled:
        order = np.argsort(mix64(present.astype(np.uint64), seed_key), kind="stable")
    starts = np.zeros(counts.num_pieces, dtype=np.int64)
    starts[present[order]] = np.cumsum(piece_sizes[order]) - piece_sizes[order]
    return starts


def split_counts(counts: Counts, split: str, num_pieces: int | None = None) -> SplitCounts:
    """The records of `split` in piece order, their strata (sorted) and each record's
    stratum index; `num_pieces` defaults to one past the last piece counted (any split)."""
    members = np.flatnonzero(counts.rows["split"] == SPLITS.index(split))
    piece = counts.rows["piece"][members]
    if np.any(piece[1:] < piece[:-1]):
        members = members[np.argsort(piece, kind="stable")]
        piece = counts.rows["piece"][members]
    num_sources = len(counts.sources)
    pair = counts.rows["label"][members].astype(np.int64) * num_sources
    pair += counts.rows["source"][members]
    # (label, source) codes are few and dense: a lookup table, not a sort of the records.
    present = np.flatnonzero(np.bincount(pair, minlength=len(counts.labels) * num_sources))
    pairs = [
        (counts.labels[code // num_sources], counts.sources[code % num_sources])
        for code in present.tolist()
    ]
    order = sorted(range(len(pairs)), key=lambda i: _stratum_sort_key(pairs[i]))
    stratum_of = np.zeros(len(counts.labels) * num_sources, dtype=np.int32)
    stratum_of[present[order]] = np.arange(len(order))
    if num_pieces is None:
        num_pieces = int(counts.rows["piece"].max()) + 1 if len(counts.rows) else 0
    return SplitCounts(
        [pairs[i] for i in order],
        piece,
        stratum_of[pair],
        counts.rows["num_rows"][members],
        num_pieces,
    )


def plan_split(
    counts: Counts,
    split: str,
    mix: MixConfig | None,
    num_output_rows: int | None,
    target_shard_rows: int,
    mode: str = "stratified",
    seed: int = 0,
    num_pieces: int | None = None,
) -> SplitPlan:
    """The layout of one split; `mix=None` keeps every row exactly once (the holdout).
    `num_pieces`: pieces the counts' piece numbers range over (default: the last + 1)."""
    records = split_counts(counts, split, num_pieces)
    strata, input_rows = records.strata, records.stratum_rows()
    if mix is None:
        output_rows = input_rows.copy()
    else:
        total = int(input_rows.sum()) if num_output_rows is None else num_output_rows
        fractions = target_fractions(strata, input_rows, mix)
        classes = np.array([_class_position(strata, label) for label, _ in strata])
        output_rows = stratum_targets(total, fractions, input_rows, classes, mix.max_oversample)
    if mode not in SHUFFLE_MODES:
        raise ValueError(f"shuffle mode {mode!r} is not one of {SHUFFLE_MODES}")
    plan = _layout(
        split,
        strata,
        input_rows,
        output_rows,
        records,
        target_shard_rows,
        stratified=mode == "stratified",
    )
    if mode not in CONTIGUOUS_MODES:
        return plan
    starts = piece_starts(
        records,
        input_rows,
        output_rows,
        plan.piece_offsets,
        shuffled=mode == "block",
        seed_key=derive_key(seed, split, "blocks"),
    )
    return replace(plan, mode=mode, piece_starts=starts)


def _layout(
    split: str,
    strata: list[tuple[Any, Any]],
    input_rows: np.ndarray,
    output_rows: np.ndarray,
    records: SplitCounts,
    target_shard_rows: int,
    stratified: bool,
) -> SplitPlan:
    labels = sorted({label for label, _ in strata}, key=_stratum_sort_key)
    group_of = np.array(
        [labels.index(label) if stratified else 0 for label, _ in strata], dtype=np.int64
    )
    num_groups = len(labels) if stratified else 1
    group_rows = np.bincount(group_of, weights=output_rows, minlength=num_groups)
    group_rows = group_rows.astype(np.int64)
    offset_in_group = np.zeros(len(strata), dtype=np.int64)
    for group in range(num_groups):
        members = np.flatnonzero(group_of == group)
        offset_in_group[members] = np.concatenate([[0], np.cumsum(output_rows[members])[:-1]])
    total = int(output_rows.sum())
    num_shards = max(1, -(-total // target_shard_rows))
    return SplitPlan(
        name=split,
        strata=strata,
        input_rows=input_rows,
        output_rows=output_rows,
        group_of=group_of,
        offset_in_group=offset_in_group,
        group_rows=group_rows,
        group_start=np.concatenate([[0], np.cumsum(group_rows)[:-1]]).astype(np.int64),
        shard_alloc=allocate_shards(group_rows, num_shards),
        piece_offsets=piece_offsets(records),
        mode="stratified" if stratified else "global",
    )


def _class_position(strata: list[tuple[Any, Any]], label: Any) -> int:
    """Index of the first stratum of `label`: a class id that works for any label type."""
    return next(i for i, (other, _) in enumerate(strata) if other == label)


def _stratum_sort_key(value: Any) -> Any:
    """Sort labels and (label, source) pairs deterministically: numbers by value, then text."""
    if isinstance(value, tuple):
        return tuple(_stratum_sort_key(part) for part in value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, value, "")
    return (1, 0, str(value))
