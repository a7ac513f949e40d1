"""Row routing is exact and independent of how the input is split into pieces."""

from collections import Counter
from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import MixConfig
from preprocessing.plan.counts import Counts
from preprocessing.plan.row_fates import holdout_mask, route_pieces, route_rows
from preprocessing.plan.split import SHUFFLE_MODES, plan_split


def route_all(
    labels: np.ndarray,
    cuts: list[int],
    output: int,
    shard_rows: int,
    mode: str = "stratified",
    seed: int = 5,
):
    """Cut `labels` into pieces at `cuts`, plan, route every piece: (plan, ids, shards, keys)."""
    bounds = [0, *sorted(set(cuts)), len(labels)]
    pieces = [np.arange(a, b) for a, b in pairwise(bounds) if b > a]
    records = Counts.of(
        (p, "train", int(label), "s", int(n))
        for p, ids in enumerate(pieces)
        for label, n in zip(*np.unique(labels[ids], return_counts=True), strict=True)
    )
    plan = plan_split(records, "train", MixConfig(), output, shard_rows, mode, seed)
    index = {stratum: i for i, stratum in enumerate(plan.strata)}
    out = []
    for p, ids in enumerate(pieces):
        offsets = np.zeros(len(plan.strata), dtype=np.int64)
        for stratum, offset in plan.piece_offsets.of_piece(p).items():
            offsets[stratum] = offset
        codes = np.array([index[(int(label), "s")] for label in labels[ids]])
        routing = route_rows(codes, offsets, plan, seed, p)
        out.append((ids[routing.rows], routing.shards, routing.order_keys))
    ids, shards, keys = (np.concatenate(part) for part in zip(*out, strict=True))
    return plan, ids, shards, keys


labels_strategy = st.lists(st.integers(0, 4), min_size=5, max_size=600).map(np.array)


@given(
    labels=labels_strategy,
    cuts_a=st.lists(st.integers(1, 599), max_size=6),
    cuts_b=st.lists(st.integers(1, 599), max_size=6),
    output=st.integers(1, 2_000),
    mode=st.sampled_from(["stratified", "global", "none"]),
)
@settings(max_examples=80, deadline=None)
def test_output_is_identical_for_any_partitioning(labels, cuts_a, cuts_b, output, mode) -> None:
    """Invariant: the set of (input id, shard, order key) does not depend on the pieces
    (`block` is left out: it permutes pieces, so its order depends on them by design)."""
    valid = lambda cuts: [c for c in cuts if c < len(labels)]  # noqa: E731
    _, ids_a, shards_a, keys_a = route_all(labels, valid(cuts_a), output, 97, mode)
    _, ids_b, shards_b, keys_b = route_all(labels, valid(cuts_b), output, 97, mode)
    rows_a = sorted(zip(ids_a.tolist(), shards_a.tolist(), keys_a.tolist(), strict=True))
    rows_b = sorted(zip(ids_b.tolist(), shards_b.tolist(), keys_b.tolist(), strict=True))
    assert rows_a == rows_b


@given(labels=labels_strategy, output=st.integers(1, 3_000), mode=st.sampled_from(SHUFFLE_MODES))
@settings(max_examples=80, deadline=None)
def test_stratum_counts_and_shard_sizes_match_the_plan_exactly(labels, output, mode) -> None:
    """Invariant: rows routed per class and per shard equal the plan's numbers exactly,
    and every output row traces to an input id."""
    plan, ids, shards, _ = route_all(labels, [len(labels) // 2], output, 113, mode)
    routed = Counter(labels[ids].tolist())
    planned = {label: int(k) for (label, _), k in zip(plan.strata, plan.output_rows, strict=True)}
    assert routed == Counter({label: k for label, k in planned.items() if k})
    assert np.array_equal(np.bincount(shards, minlength=plan.num_shards), plan.shard_rows())
    assert set(ids.tolist()) <= set(range(len(labels)))


@given(labels=labels_strategy)
@settings(max_examples=40, deadline=None)
def test_pure_undersampling_never_duplicates_a_row(labels) -> None:
    """Invariant: when every stratum keeps at most its input rows, no input id repeats."""
    smallest = int(np.bincount(labels)[np.unique(labels)].min())
    num_classes = len(np.unique(labels))
    _, ids, _, _ = route_all(labels, [len(labels) // 3], smallest * num_classes, 50)
    assert len(ids) == len(set(ids.tolist())) == smallest * num_classes


@given(labels=labels_strategy, output=st.integers(1, 2_000))
@settings(max_examples=40, deadline=None)
def test_order_keys_are_unique_so_in_shard_order_is_total(labels, output) -> None:
    """Invariant: no two output rows share an order key (the in-shard order is well defined)."""
    _, _, _, keys = route_all(labels, [], output, 64)
    assert len(set(keys.tolist())) == len(keys)


def test_holdout_draw_depends_on_file_and_row_only() -> None:
    """Invariant: the held-out rows of a file are the same when read in two row ranges."""
    whole = holdout_mask("a.parquet", 0, 1_000, seed=1, fraction=0.2)
    parts = np.concatenate(
        [holdout_mask("a.parquet", 0, 300, 1, 0.2), holdout_mask("a.parquet", 300, 700, 1, 0.2)]
    )
    assert np.array_equal(whole, parts)
    assert 0.15 < whole.mean() < 0.25


@given(
    labels=labels_strategy,
    output=st.integers(1, 2_000),
    cuts=st.lists(st.integers(1, 599), max_size=4),
)
@settings(max_examples=40, deadline=None)
def test_none_mode_keeps_input_order(labels, output, cuts) -> None:
    """Invariant: in `none` mode, reading shards in order (rows by key) gives input ids in
    non-decreasing order: a contiguous rebalance."""
    cuts = [c for c in cuts if c < len(labels)]
    _, ids, shards, keys = route_all(labels, cuts, output, 50, "none")
    order = np.lexsort((keys, shards))
    assert np.all(np.diff(ids[order]) >= 0)


@given(
    labels=labels_strategy,
    cuts=st.lists(st.integers(1, 599), max_size=8),
    output=st.integers(1, 2_000),
    mode=st.sampled_from(SHUFFLE_MODES),
)
@settings(max_examples=60, deadline=None)
def test_routing_many_pieces_at_once_equals_one_at_a_time(labels, cuts, output, mode) -> None:
    """Invariant: `route_pieces` over all pieces of a map task gives every row the same
    (shard, order key) copies as `route_rows` piece by piece, in every mode."""
    plan, ids, shards, keys = route_all(
        labels, [c for c in cuts if c < len(labels)], output, 97, mode
    )
    bounds = [0, *sorted({c for c in cuts if c < len(labels)}), len(labels)]
    pieces = [(a, b) for a, b in pairwise(bounds) if b > a]
    index = {stratum: i for i, stratum in enumerate(plan.strata)}
    offsets = np.zeros((len(pieces), len(plan.strata)), dtype=np.int64)
    for p in range(len(pieces)):
        for stratum, offset in plan.piece_offsets.of_piece(p).items():
            offsets[p, stratum] = offset
    codes = np.array([index[(int(label), "s")] for label in labels])
    piece_of = np.repeat(np.arange(len(pieces)), [b - a for a, b in pieces])
    routing = route_pieces(codes, piece_of, offsets, plan, 5, np.arange(len(pieces)))
    batched = sorted(
        zip(
            routing.rows.tolist(), routing.shards.tolist(), routing.order_keys.tolist(), strict=True
        )
    )
    assert batched == sorted(zip(ids.tolist(), shards.tolist(), keys.tolist(), strict=True))


def test_a_map_task_may_hold_a_piece_without_rows_of_a_split_in_contiguous_modes() -> None:
    """Invariant: in `none` mode a task whose pieces 0 and 1 only piece 0 has holdout rows
    in routes piece 0's 3 rows to positions 0, 1, 2 (piece 1 has a start too; a start
    missing for it raised KeyError once)."""
    records = Counts.of([(0, "holdout", 0, "s", 3), (1, "train", 0, "s", 4)])
    plan = plan_split(records, "holdout", None, None, 100, "none", 0)
    routing = route_pieces(
        np.zeros(3, dtype=np.int64),
        np.zeros(3, dtype=np.int64),
        np.zeros((2, 1), dtype=np.int64),
        plan,
        0,
        np.array([0, 1]),
    )
    assert routing.rows.tolist() == [0, 1, 2] and routing.order_keys.tolist() == [0, 1, 2]
