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


def derive_key(*parts: object) -> int:
    """A 64-bit key from any printable parts (seed, stratum, split...), stable across runs."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def mix64(values: np.ndarray, key: int | np.ndarray) -> np.ndarray:
    """splitmix64 finaliser of `values + key`: a keyed 64-bit hash, elementwise (`key` may
    be one key or one per value)."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.asarray(key, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def unit_interval(values: np.ndarray, key: int) -> np.ndarray:
    """Keyed uniform floats in [0, 1) from integer indices (53 bits of the hash)."""
    return (mix64(values, key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _feistel(values: np.ndarray, right_bits: np.ndarray, left_mask: np.ndarray,
             right_mask: np.ndarray, round_keys: list[np.ndarray]) -> np.ndarray:
    left = values >> right_bits
    right = values & right_mask
    for round_index, round_key in enumerate(round_keys):
        if round_index % 2 == 0:
            left ^= mix64(right, round_key) & left_mask
        else:
            right ^= mix64(left, round_key) & right_mask
    return (left << right_bits) | right


def permute_many(indices: np.ndarray, groups: np.ndarray, domains: np.ndarray,
                 keys: np.ndarray) -> np.ndarray:
    """`permute(indices[i], domains[g], keys[g])` with g = groups[i], for every i in one
    vectorised pass: a piece's rows of all strata at once, no Python loop per stratum."""
    domains = np.asarray(domains, dtype=np.int64)
    used = np.bincount(groups, minlength=len(domains)) > 0
    if (domains[used] <= 0).any():
        raise ValueError(f"permutation domains must be positive, got {domains[used].min()}")
    bits = _domain_bits(domains.tobytes())
    right_bits_of = bits // np.uint64(2)
    one = np.uint64(1)
    right_bits = right_bits_of[groups]
    right_mask = (one << right_bits) - one
    left_mask = (one << (bits - right_bits_of)[groups]) - one
    table = _round_keys(np.asarray(keys, dtype=np.uint64).tobytes())
    round_keys = [table[r][groups] for r in range(_NUM_ROUNDS)]
    limit = domains[groups].astype(np.uint64)
    result = _feistel(np.asarray(indices, dtype=np.uint64), right_bits, left_mask, right_mask,
                      round_keys)
    outside = np.flatnonzero(result >= limit)
    while len(outside):  # cycle walking: re-encrypt until the value is back in [0, n)
        result[outside] = _feistel(result[outside], right_bits[outside], left_mask[outside],
                                   right_mask[outside], [key[outside] for key in round_keys])
        outside = outside[result[outside] >= limit[outside]]
    return result.astype(np.int64)


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
    return np.array([[derive_key(int(key), r) for key in values] for r in range(_NUM_ROUNDS)],
                    dtype=np.uint64).reshape(_NUM_ROUNDS, len(values))


def permute(indices: np.ndarray, n: int, key: int) -> np.ndarray:
    """Image of `indices` (each in [0, n)) under the keyed bijection of [0, n)."""
    if n <= 0:
        raise ValueError(f"permutation domain must be positive, got n={n}")
    values = np.asarray(indices, dtype=np.uint64)
    return permute_many(values, np.zeros(len(values), dtype=np.int64), np.array([n]),
                        np.array([key], dtype=np.uint64))


@lru_cache(maxsize=256)
def derive_keys(count: int, *parts: object) -> np.ndarray:
    """`derive_key(*parts, i)` for i in range(count): one key per stratum or group (cached:
    read-only)."""
    keys = np.array([derive_key(*parts, i) for i in range(count)], dtype=np.uint64)
    keys.setflags(write=False)
    return keys
