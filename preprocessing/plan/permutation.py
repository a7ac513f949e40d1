"""Keyed pseudo-random permutations and hashes over integer indices, vectorised in numpy.

Every random decision of a reshard (which rows are held out, which rows an
undersampled stratum keeps, where each output row lands) is a pure function of
the seed and a row's global index through these functions, never of how the
work is split across Dask tasks. `permute(indices, n, key)` is a bijection on
`[0, n)`: a 4-round alternating Feistel network on the next power of two (halves of
ceil/floor bits, each round xors one half with a keyed hash of the other), with cycle
walking back into range: the domain is under 2n, so under 2 rounds of walking on
average (a balanced network needs the next even power, up to 4n).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

_NUM_ROUNDS = 4
# Below this many rows outside its domain, a group's cycle walk joins every other group's
# (per-row keys cost more per row than scalar ones, and less than ~40 calls per group).
JOINT_WALK_ROWS = 4096


def derive_key(*parts: object) -> int:
    """A 64-bit key from any printable parts (seed, stratum, split...), stable across runs."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def mix64(values: np.ndarray, key: int | np.ndarray) -> np.ndarray:
    """splitmix64 finaliser of `values + key`: a keyed 64-bit hash, elementwise (`key` may
    be one key or one per value), in a new array with every step in place (half the
    passes over memory of one temporary per step)."""
    with np.errstate(over="ignore"):
        z = np.add(values, np.asarray(key, dtype=np.uint64), dtype=np.uint64, casting="unsafe")
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
        return z


def unit_interval(values: np.ndarray, key: int) -> np.ndarray:
    """Keyed uniform floats in [0, 1) from integer indices (53 bits of the hash)."""
    return (mix64(values, key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _feistel(values: np.ndarray, bits: int, round_keys: list[int]) -> np.ndarray:
    """One pass of the Feistel network on a domain of `bits` bits (one permutation)."""
    right_bits = np.uint64(bits // 2)
    right_mask = np.uint64((1 << (bits // 2)) - 1)
    left_mask = np.uint64((1 << (bits - bits // 2)) - 1)
    left = values >> right_bits
    right = values & right_mask
    for round_index, round_key in enumerate(round_keys):
        if round_index % 2 == 0:
            left ^= mix64(right, round_key) & left_mask
        else:
            right ^= mix64(left, round_key) & right_mask
    left <<= right_bits
    left |= right
    return left


def group_runs(groups: np.ndarray, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds): `order` lists the rows group by group (stably), group g's rows
    are order[bounds[g]:bounds[g + 1]]."""
    narrow = groups.astype(np.int16 if num_groups < 1 << 15 else np.int64, copy=False)
    order = np.argsort(narrow, kind="stable")  # a radix sort on narrow integers
    bounds = np.r_[0, np.cumsum(np.bincount(groups, minlength=num_groups))]
    return order, bounds


def permute_many(
    indices: np.ndarray,
    groups: np.ndarray,
    domains: np.ndarray,
    keys: np.ndarray,
    runs: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """`permute(indices[i], domains[g], keys[g])` with g = groups[i], for every i: a
    piece's rows of all strata at once. Rows are taken group by group (`runs`, as
    `group_runs` makes them, when the caller has them already), so that each group's
    network runs with scalar keys and masks (about half the time of per-row key
    arrays, benchmarks/RESULTS.md M31), and so does its cycle walking while many of its
    rows are outside the domain; the last few of every group then walk back together,
    with per-row keys (walking each group to its end cost a dozen passes of ~40 numpy
    calls per group, on ever fewer rows: RESULTS.md M32)."""
    domains = np.asarray(domains, dtype=np.int64)
    order, bounds = runs if runs is not None else group_runs(groups, len(domains))
    present = np.flatnonzero(np.diff(bounds))
    if (domains[present] <= 0).any():
        raise ValueError(f"permutation domains must be positive, got {domains[present].min()}")
    bits = _domain_bits(domains.tobytes())
    table = _round_keys(np.asarray(keys, dtype=np.uint64).tobytes())
    values = np.asarray(indices).astype(np.uint64)[order]
    outside = [
        _walk_group(
            values[int(bounds[group]) : int(bounds[group + 1])],
            int(domains[group]),
            int(bits[group]),
            [int(key) for key in table[:, group]],
        )
        + bounds[group]
        for group in present.tolist()
    ]
    leftover = np.concatenate(outside) if outside else np.zeros(0, dtype=np.int64)
    if len(leftover):
        group_of = np.repeat(np.arange(len(domains)), np.diff(bounds))
        _walk_back(values, leftover, group_of, domains, bits, table)
    result = np.empty(len(values), dtype=np.int64)
    result[order] = values
    return result


def _walk_group(run: np.ndarray, domain: int, bits: int, round_keys: list[int]) -> np.ndarray:
    """One group's rows through its network in place, cycle walking with scalar keys while
    more than JOINT_WALK_ROWS are outside the domain; the rows still outside."""
    with np.errstate(over="ignore"):
        run[:] = _feistel(run, bits, round_keys)
        outside = np.flatnonzero(run >= np.uint64(domain))
        while len(outside) > JOINT_WALK_ROWS:
            run[outside] = _feistel(run[outside], bits, round_keys)
            outside = outside[run[outside] >= np.uint64(domain)]
    return outside


def _walk_back(
    values: np.ndarray,
    outside: np.ndarray,
    group_of: np.ndarray,
    domains: np.ndarray,
    bits: np.ndarray,
    table: np.ndarray,
) -> None:
    """Cycle walking, in place: re-encrypt `values[outside]` (rows in group order, row i
    of group `group_of[i]`) until each is back inside its group's domain."""
    with np.errstate(over="ignore"):
        while len(outside):
            group = group_of[outside]
            walked = _feistel_rows(values[outside], bits[group], table[:, group])
            values[outside] = walked
            outside = outside[walked >= domains[group].astype(np.uint64)]


def _feistel_rows(values: np.ndarray, bits: np.ndarray, round_keys: np.ndarray) -> np.ndarray:
    """`_feistel` with each row's own domain bits and round keys ([round, row])."""
    right_bits = bits // np.uint64(2)
    one = np.uint64(1)
    right_mask = (one << right_bits) - one
    left_mask = (one << (bits - right_bits)) - one
    left = values >> right_bits
    right = values & right_mask
    for round_index in range(len(round_keys)):
        if round_index % 2 == 0:
            left ^= mix64(right, round_keys[round_index]) & left_mask
        else:
            right ^= mix64(left, round_keys[round_index]) & right_mask
    left <<= right_bits
    left |= right
    return left


# A map task permutes every piece with the same few keys and domains: hashing them once per
# piece cost more than the permutation of a small piece.
@lru_cache(maxsize=256)
def _domain_bits(domains: bytes) -> np.ndarray:
    """Bits of the Feistel domain (at least 2) of each permutation domain."""
    values = np.frombuffer(domains, dtype=np.int64)
    return np.array([max(2, (int(n) - 1).bit_length()) for n in values], dtype=np.uint64)


@lru_cache(maxsize=256)
def _round_keys(keys: bytes) -> np.ndarray:
    """[round, key] table of the Feistel round keys of each permutation key."""
    values = np.frombuffer(keys, dtype=np.uint64)
    return np.array(
        [[derive_key(int(key), r) for key in values] for r in range(_NUM_ROUNDS)], dtype=np.uint64
    ).reshape(_NUM_ROUNDS, len(values))


def permute(indices: np.ndarray, n: int, key: int) -> np.ndarray:
    """Image of `indices` (each in [0, n)) under the keyed bijection of [0, n)."""
    if n <= 0:
        raise ValueError(f"permutation domain must be positive, got n={n}")
    values = np.asarray(indices, dtype=np.uint64)
    return permute_many(
        values,
        np.zeros(len(values), dtype=np.int64),
        np.array([n]),
        np.array([key], dtype=np.uint64),
    )


@lru_cache(maxsize=256)
def derive_keys(count: int, *parts: object) -> np.ndarray:
    """`derive_key(*parts, i)` for i in range(count): one key per stratum or group (cached:
    read-only)."""
    keys = np.array([derive_key(*parts, i) for i in range(count)], dtype=np.uint64)
    keys.setflags(write=False)
    return keys
