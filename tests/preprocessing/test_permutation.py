"""The keyed permutation is a bijection, deterministic, and changes with its key."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.plan.permutation import derive_key, permute, unit_interval


@given(n=st.integers(1, 5_000), seed=st.integers(0, 2**32))
@settings(max_examples=60, deadline=None)
def test_permute_is_a_bijection_on_its_domain(n: int, seed: int) -> None:
    """Invariant: permute(range(n)) is exactly a rearrangement of range(n)."""
    image = permute(np.arange(n), n, derive_key(seed))
    assert sorted(image.tolist()) == list(range(n))


@given(n=st.integers(2, 5_000), split=st.integers(1, 4_999))
@settings(max_examples=40, deadline=None)
def test_permute_does_not_depend_on_how_indices_are_batched(n: int, split: int) -> None:
    """Invariant: each index's image depends on (key, index) only, not on its batch."""
    split = min(split, n - 1)
    key = derive_key("batching")
    whole = permute(np.arange(n), n, key)
    parts = np.concatenate([permute(np.arange(split), n, key),
                            permute(np.arange(split, n), n, key)])
    assert np.array_equal(whole, parts)


def test_different_keys_give_different_orders() -> None:
    """Invariant: two keys give two different permutations of a large domain."""
    first = permute(np.arange(1000), 1000, derive_key(1))
    second = permute(np.arange(1000), 1000, derive_key(2))
    assert not np.array_equal(first, second)


def test_unit_interval_is_roughly_uniform() -> None:
    """Invariant: keyed uniforms lie in [0, 1) and 10% of them fall under 0.1 (+-1%)."""
    values = unit_interval(np.arange(100_000), derive_key("u"))
    assert values.min() >= 0 and values.max() < 1
    assert abs((values < 0.1).mean() - 0.1) < 0.01


def test_an_index_lands_uniformly_over_keys() -> None:
    """Invariant: over 4,000 keys, index 3 of a domain of 10 (cycle walking from 16) lands
    on every position about equally often (each count within 5 sigma of 400), and on a
    domain of 1,000 the image is uncorrelated with the index (|r| < 0.1)."""
    landed = np.array([permute(np.array([3]), 10, derive_key("u", k))[0] for k in range(4000)])
    counts = np.bincount(landed, minlength=10)
    assert np.all(np.abs(counts - 400) < 5 * np.sqrt(400 * 0.9)), counts
    image = permute(np.arange(1000), 1000, derive_key("corr"))
    assert abs(np.corrcoef(np.arange(1000), image)[0, 1]) < 0.1
