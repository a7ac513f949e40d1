"""Keyed pseudo-random permutations and hashes over integer indices, vectorised in numpy.

Every random decision of a reshard (which rows are held out, which rows an
undersampled stratum keeps, where each output row lands) is a pure function of
the seed and a row's global index through these functions, never of how the
work is split across Dask tasks. `permute(indices, n, key)` is a bijection on
`[0, n)`: a 4-round balanced Feistel network on the next even power of two,
with cycle walking back into range (at most 4x the domain, so few walks).
"""

from __future__ import annotations

import hashlib

import numpy as np

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_NUM_ROUNDS = 4


def derive_key(*parts: object) -> int:
    """A 64-bit key from any printable parts (seed, stratum, split...), stable across runs."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def mix64(values: np.ndarray, key: int) -> np.ndarray:
    """splitmix64 finaliser of `values + key`: a keyed 64-bit hash, elementwise."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + np.uint64(key)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def unit_interval(values: np.ndarray, key: int) -> np.ndarray:
    """Keyed uniform floats in [0, 1) from integer indices (53 bits of the hash)."""
    return (mix64(values, key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _round_keys(key: int) -> list[int]:
    return [derive_key(key, round_index) for round_index in range(_NUM_ROUNDS)]


def _feistel(values: np.ndarray, half_bits: int, round_keys: list[int]) -> np.ndarray:
    half_mask = np.uint64((1 << half_bits) - 1)
    left = values >> np.uint64(half_bits)
    right = values & half_mask
    for round_key in round_keys:
        left, right = right, left ^ (mix64(right, round_key) & half_mask)
    return (left << np.uint64(half_bits)) | right


def permute(indices: np.ndarray, n: int, key: int) -> np.ndarray:
    """Image of `indices` (each in [0, n)) under the keyed bijection of [0, n)."""
    if n <= 0:
        raise ValueError(f"permutation domain must be positive, got n={n}")
    values = np.asarray(indices, dtype=np.uint64)
    if n == 1:
        return np.zeros_like(values, dtype=np.int64)
    half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
    round_keys = _round_keys(key)
    result = _feistel(values, half_bits, round_keys)
    outside = result >= np.uint64(n)
    while outside.any():  # cycle walking: re-encrypt until the value is back in [0, n)
        result[outside] = _feistel(result[outside], half_bits, round_keys)
        outside = result >= np.uint64(n)
    return result.astype(np.int64)
