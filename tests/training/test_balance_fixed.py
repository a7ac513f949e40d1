"""`loader.balance: fixed` (training/config.py, training/data/balance.py): shares by hand
are validated with errors naming the field, refused on another world size, and cut every
global step exactly as `row_bounds` does, with the same rows as `equal`'s step and the
loss scale that keeps the step's mean loss."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from training.config import LoaderConfig
from training.data.balance import row_bounds
from training.data.loader import ShardStream

BATCH, PARTITIONS = 8, 12


def fixed_stream(root: str, shares: list[float]) -> ShardStream:
    config = LoaderConfig(
        batch_size=BATCH, num_partitions=PARTITIONS, balance="fixed", balance_shares=shares
    )
    return ShardStream(root, "train", config, seed=5)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from([0.0, -0.5, 1.5, math.nan, math.inf]),
        ),
        min_size=0,
        max_size=5,
    )
)
def test_shares_that_are_not_positive_fractions_summing_to_one_are_refused(
    shares: list[float],
) -> None:
    """Invariant: any list of shares that are not all > 0 and finite with a sum within 1e-6
    of 1 (empty, NaN, infinite, zero, negative) is refused, the error naming
    loader.balance_shares; any that is, is kept as given."""
    valid = (
        bool(shares)
        and all(math.isfinite(share) and share > 0 for share in shares)
        and abs(sum(shares) - 1.0) <= 1e-6
    )
    if valid:
        assert LoaderConfig(balance="fixed", balance_shares=shares).balance_shares == shares
        return
    with pytest.raises(ValidationError, match="balance_shares"):
        LoaderConfig(balance="fixed", balance_shares=shares)


def test_shares_go_with_fixed_and_only_with_it() -> None:
    """Invariant: `fixed` without shares, or shares with another balance, is refused, the
    error naming both fields; `fixed` needs num_workers 0 like `speed`."""
    with pytest.raises(ValidationError, match=r"balance_shares goes with loader\.balance: fixed"):
        LoaderConfig(balance="fixed")
    with pytest.raises(ValidationError, match=r"balance_shares goes with loader\.balance: fixed"):
        LoaderConfig(balance="speed", balance_shares=[0.5, 0.5])
    with pytest.raises(ValidationError, match="num_workers"):
        LoaderConfig(balance="fixed", balance_shares=[0.5, 0.5], num_workers=2)


def test_shares_for_another_world_size_are_refused_naming_the_field(
    dataset_cache: Callable[..., str],
) -> None:
    """Invariant: three shares on a two-rank job fail at the first batch, naming
    loader.balance_shares and both counts, before any row is handed out."""
    stream = fixed_stream(dataset_cache(128, row_group_size=8), [0.5, 0.25, 0.25])
    with pytest.raises(ValueError, match=r"balance_shares has 3 shares.*runs 2 ranks"):
        next(stream.iterate((0, 2)))


@pytest.mark.parametrize("shares", [[0.75, 0.25], [0.5, 0.5], [0.1, 0.3, 0.6]])
def test_a_fixed_split_cuts_every_step_of_equals_rows_by_its_shares(
    dataset_cache: Callable[..., str], shares: list[float]
) -> None:
    """Invariant: under `fixed`, every global step's ranks together hold exactly the rows of
    `equal`'s step (the same ids, in order), rank r holds row_bounds(shares)'s r-th slice,
    its loss_scale is its rows x W / the step's rows, and the split never moves, through
    the epoch and into the next."""
    root = dataset_cache(384, row_group_size=8)
    world = len(shares)
    equal = [
        ShardStream(root, "train", LoaderConfig(batch_size=BATCH, num_partitions=PARTITIONS), 5)
        for _ in range(world)
    ]
    fixed = [fixed_stream(root, shares) for _ in range(world)]
    sizes = np.diff(row_bounds(np.asarray(shares), world * BATCH))
    steps = zip(
        zip(*(s.iterate((r, world)) for r, s in enumerate(equal)), strict=True),
        zip(*(s.iterate((r, world)) for r, s in enumerate(fixed)), strict=True),
        strict=True,
    )
    count = 0
    for equal_step, fixed_step in steps:
        count += 1
        whole = torch.cat([batch["id"] for batch in equal_step])
        assert torch.equal(torch.cat([batch["id"] for batch in fixed_step]), whole)
        assert [len(batch["id"]) for batch in fixed_step] == list(sizes)
        for batch, rows in zip(fixed_step, sizes, strict=True):
            assert float(batch["loss_scale"]) == pytest.approx(rows * world / (world * BATCH))
    assert count == 384 // (world * BATCH)
    assert np.array_equal(fixed[0].shares.shares_at(1, 0, world), np.asarray(shares))
