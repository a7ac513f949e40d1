"""The keyed permutation is a bijection, deterministic, and changes with its key."""

import hashlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.plan.permutation import (
    JOINT_WALK_ROWS,
    _feistel,
    derive_key,
    permute,
    permute_many,
    unit_interval,
)

PINNED_IMAGES = "2b256e2277bc2969f1039c0e5ee1084ba32861269f47ced20debb3f0f7748bbf"


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
    parts = np.concatenate(
        [permute(np.arange(split), n, key), permute(np.arange(split, n), n, key)]
    )
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


def walk_group_by_group(
    indices: np.ndarray, groups: np.ndarray, domains: np.ndarray, keys: np.ndarray
) -> np.ndarray:
    """The reference: each group's rows through its own network, cycle walking that
    group's rows until all are inside its domain (how permute_many walked until M32)."""
    result = np.empty(len(indices), dtype=np.int64)
    for group in np.unique(groups).tolist():
        rows = np.flatnonzero(groups == group)
        domain = int(domains[group])
        bits = max(2, (domain - 1).bit_length())
        round_keys = [derive_key(int(keys[group]), r) for r in range(4)]
        values = indices[rows].astype(np.uint64)
        values = _feistel(values, bits, round_keys)
        outside = np.flatnonzero(values >= np.uint64(domain))
        while len(outside):
            values[outside] = _feistel(values[outside], bits, round_keys)
            outside = outside[values[outside] >= np.uint64(domain)]
        result[rows] = values
    return result


@given(
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=60),
    slack=st.lists(st.integers(0, 3), min_size=60, max_size=60),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=60, deadline=None)
def test_permute_many_walks_back_like_the_reference(
    sizes: list[int], slack: list[int], seed: int
) -> None:
    """Invariant: `permute_many`, whose rows outside their domain walk back all groups at
    once, gives each row the image the group-by-group reference gives it, over empty and
    one-row groups, skewed sizes, domains equal to the group's rows (a bijection of the
    group) or larger (resampling indices), and up to 60 groups."""
    rng = np.random.default_rng(seed)
    groups = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    domains = np.array(
        [max(1, size * (1 + extra)) for size, extra in zip(sizes, slack, strict=False)],
        dtype=np.int64,
    )
    indices = (rng.random(len(groups)) * domains[groups]).astype(np.int64)
    keys = rng.integers(0, 2**63, len(sizes), dtype=np.uint64)
    expected = walk_group_by_group(indices, groups, domains, keys)
    assert np.array_equal(permute_many(indices, groups, domains, keys), expected)


def test_permute_many_images_are_pinned() -> None:
    """Invariant: the images of a fixed input are those ballast computed when this test
    was written (sha256 of the int64 images): shard bytes and version ids follow from them,
    so any rewrite of the permutation must keep them."""
    rng = np.random.default_rng(7)
    groups = rng.choice(48, 100_000, p=rng.dirichlet(np.full(48, 0.3)))
    domains = np.bincount(groups, minlength=48) * 2 + 1
    indices = (rng.random(len(groups)) * domains[groups]).astype(np.int64)
    keys = np.array([derive_key("pinned", group) for group in range(48)], dtype=np.uint64)
    images = permute_many(indices, groups, domains, keys)
    assert hashlib.sha256(images.astype("<i8").tobytes()).hexdigest() == PINNED_IMAGES


def test_permute_many_walks_large_groups_like_the_reference() -> None:
    """Invariant: groups with more than JOINT_WALK_ROWS rows outside their domain (domains
    just above a power of two leave about half outside) walk with their own keys first and
    still give the reference's images."""
    rng = np.random.default_rng(3)
    sizes, domains = [40_000, 2, 17_000, 0, 9_000], np.array([65_537, 2, 32_769, 5, 9_000])
    assert JOINT_WALK_ROWS < 40_000 // 4  # about 20,000 of group 0 land outside at first
    groups = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    indices = (rng.random(len(groups)) * domains[groups]).astype(np.int64)
    keys = rng.integers(0, 2**63, len(sizes), dtype=np.uint64)
    expected = walk_group_by_group(indices, groups, domains, keys)
    assert np.array_equal(permute_many(indices, groups, domains, keys), expected)
