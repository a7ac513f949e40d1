"""The planner is exact: stratum targets, shard sizes and the stratified per-shard mix."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from preprocessing.config import MixConfig
from preprocessing.plan.counts import Counts, dense_offsets
from preprocessing.plan.split import (
    SHUFFLE_MODES,
    allocate_shards,
    apportion,
    contiguous_rows,
    plan_split,
)

stratum_counts = st.lists(st.integers(1, 2_000), min_size=1, max_size=12)


def records_from(counts: list[int], num_pieces: int = 3) -> Counts:
    """Stratum i = (class i // 2, source i % 2), its rows spread over `num_pieces` pieces."""
    records = []
    for stratum, total in enumerate(counts):
        shares = apportion(total, np.ones(num_pieces))
        records += [
            (piece, "train", stratum // 2, stratum % 2, int(n))
            for piece, n in enumerate(shares)
            if n
        ]
    return Counts.of(records)


@given(total=st.integers(0, 10**9), weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=50))
def test_apportion_sums_exactly_and_stays_within_one_of_the_ideal(total, weights) -> None:
    """Invariant: integer shares sum to the total and each is within 1 of its exact share."""
    fractions = np.array(weights)
    shares = apportion(total, fractions)
    assert shares.sum() == total
    assert np.all(np.abs(shares - fractions / fractions.sum() * total) < 1)


@given(
    counts=stratum_counts,
    output=st.integers(1, 50_000),
    shard=st.integers(1, 5_000),
    mode=st.sampled_from(SHUFFLE_MODES),
)
@settings(max_examples=80, deadline=None)
def test_every_shard_has_total_over_shards_rows_or_one_more(counts, output, shard, mode) -> None:
    """Invariant: shard sizes are N // S or N // S + 1 and add up to N, in every mode."""
    plan = plan_split(records_from(counts), "train", MixConfig(), output, shard, mode)
    rows = plan.shard_rows()
    assert rows.sum() == output == plan.num_output_rows
    assert set(rows.tolist()) <= {output // plan.num_shards, output // plan.num_shards + 1}
    assert rows.max() <= shard


@given(counts=stratum_counts, output=st.integers(1, 50_000), num_shards=st.integers(1, 40))
@settings(max_examples=80, deadline=None)
def test_stratified_shards_carry_the_global_class_mix_within_one_row(
    counts, output, num_shards
) -> None:
    """Invariant: in stratified mode every shard holds floor or ceil of K_c / S rows of class c."""
    plan = plan_split(
        records_from(counts), "train", MixConfig(), output, -(-output // num_shards), "stratified"
    )
    per_class = plan.group_rows
    assert np.all(plan.shard_alloc >= per_class // plan.num_shards)
    assert np.all(plan.shard_alloc <= -(-per_class // plan.num_shards))


@given(counts=stratum_counts, output=st.integers(1, 50_000))
@example(counts=[1, 1, 1, 1], output=2)  # equal strata: ties must not favour one class
@settings(max_examples=60, deadline=None)
def test_uniform_mix_gives_every_class_the_same_rows_within_one(counts, output) -> None:
    """Invariant: uniform class weighting splits the output evenly over classes (+-1 row)."""
    plan = plan_split(records_from(counts), "train", MixConfig(), output, 10**9)
    assert plan.group_rows.max() - plan.group_rows.min() <= 1


def test_oversampling_cap_moves_the_excess_to_other_strata() -> None:
    """Invariant: no stratum exceeds max_oversample x its input; the total is still met."""
    records = records_from([10, 1_000, 1_000, 1_000])
    plan = plan_split(records, "train", MixConfig(max_oversample=2.0), 1_200, 500)
    assert np.all(plan.output_rows <= 2 * plan.input_rows)
    assert plan.num_output_rows == 1_200


def test_explicit_weights_must_name_every_class() -> None:
    """Invariant: a class missing from explicit weights is an error naming the class."""
    mix = MixConfig(class_weighting="explicit", class_weights={"0": 1.0})
    with pytest.raises(ValueError, match=r"\['1'\]"):
        plan_split(records_from([5, 5, 5, 5]), "train", mix, None, 100)


def test_piece_offsets_are_running_totals_in_piece_order() -> None:
    """Invariant: a piece's offset for a stratum is the stratum's rows in earlier pieces."""
    records = Counts.of([(2, "train", 0, "a", 5), (0, "train", 0, "a", 3), (1, "train", 0, "a", 4)])
    plan = plan_split(records, "train", MixConfig(), None, 100)
    assert [plan.piece_offsets.of_piece(p) for p in range(3)] == [{0: 0}, {0: 3}, {0: 7}]


def test_piece_offsets_skip_pieces_and_strata_without_rows() -> None:
    """Invariant: with two strata and pieces lacking one or both, each piece's offset of a
    stratum is that stratum's rows in earlier pieces; a piece without rows has none, and
    the dense [piece, stratum] view holds 0 there."""
    records = Counts.of(
        [
            (0, "train", 0, "a", 3),
            (0, "train", 1, "a", 2),
            (2, "train", 1, "a", 4),
            (3, "train", 0, "a", 6),
            (3, "holdout", 1, "a", 9),
            (3, "train", 1, "a", 1),
        ]
    )
    plan = plan_split(records, "train", MixConfig(), None, 100, num_pieces=5)
    assert [plan.piece_offsets.of_piece(p) for p in range(5)] == [
        {0: 0, 1: 0},
        {},
        {1: 2},
        {0: 3, 1: 6},
        {},
    ]
    dense = dense_offsets(plan.piece_offsets.flat(1, 4), 2)
    assert dense.tolist() == [[0, 0], [0, 2], [3, 6]]


@pytest.mark.parametrize("mode", ["none", "block"])
def test_contiguous_piece_starts_cover_every_piece_with_rows(mode: str) -> None:
    """Invariant: in contiguous modes the pieces with rows of a split get disjoint runs of
    output positions that tile [0, output rows) (input order in `none`), and a piece
    without rows of the split (here piece 1, holdout only) gets a start too."""
    records = Counts.of(
        [
            (0, "train", 0, "a", 3),
            (1, "holdout", 0, "a", 5),
            (2, "train", 0, "a", 4),
            (2, "train", 1, "a", 2),
        ]
    )
    plan = plan_split(records, "train", MixConfig(), 18, 100, mode, seed=3)
    assert plan.piece_starts is not None and len(plan.piece_starts) == 3
    # Piece 0 makes 3 output rows, piece 2 15 (7 rows of class 0 and 2 of class 1 to 9 each).
    starts = plan.piece_starts[[0, 2]].tolist()
    assert starts == [0, 3] if mode == "none" else starts in ([0, 3], [15, 0])


def test_allocation_deals_extras_round_robin() -> None:
    """Invariant: 7 and 5 rows over 4 shards give shard sizes 3,3,3,3 and class spreads +-1."""
    alloc = allocate_shards(np.array([7, 5]), 4)
    assert alloc.sum(axis=1).tolist() == [3, 3, 3, 3]
    assert alloc.sum(axis=0).tolist() == [7, 5]


@given(n=st.integers(1, 500), k=st.integers(0, 2_000), cut=st.integers(0, 500))
def test_systematic_resampling_counts_add_up_over_any_split(n, k, cut) -> None:
    """Invariant: contiguous-mode output counts over [0, cut) and [cut, n) sum to exactly k."""
    cut = min(cut, n)
    total = contiguous_rows(0, cut, n, k) + contiguous_rows(cut, n - cut, n, k)
    assert total == k
