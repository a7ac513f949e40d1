"""Distinct values of a column, estimated in fixed memory and merged across files.

A K-minimum-values sketch: the `SKETCH_SIZE` smallest distinct 64-bit hashes of the
values seen. Below that many distinct values the count is exact; above it the k-th
smallest hash h gives (k - 1) * 2**64 / h, within about 1/sqrt(k) = 1.6% (one standard
deviation). Sketches of two files merge into the sketch of both, so the scan's per-file
tasks need not share a set. Hashes are pandas' (SipHash under a fixed key): the same
value hashes alike in every process and on every run.

`identifies_rows` is the one rule, shared by the scan's warning and `ballast init`'s
proposal, for a column whose values (almost) tell rows apart: an id, not a feature.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

SKETCH_SIZE = 4096
# Distinct values / rows at which a column identifies rows: a key has 1.0; 0.95 leaves
# room for the sketch's error and a few repeats, and stays above measured features (a car's
# weight in pounds: 0.88 of 406 rows).
IDENTIFYING_FRACTION = 0.95
MIN_IDENTIFYING_ROWS = 50  # below this a handful of distinct values says nothing


def value_hashes(values: np.ndarray) -> np.ndarray:
    """uint64 hashes of integers or Python strings (an object array), one per value."""
    hashed = pd.util.hash_array(values, categorize=False)
    return np.asarray(hashed, dtype=np.uint64)


def fold_hashes(sketch: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """The sketch of the values of `sketch` and `hashes` together (sorted, distinct).
    Only hashes below a full sketch's largest can enter it; of the rest, a hash table's
    distinct values and a partition, so a batch costs no sort of all its rows."""
    if len(sketch) == SKETCH_SIZE:
        hashes = hashes[hashes < sketch[-1]]
    if not len(hashes):
        return sketch
    candidates = pd.unique(hashes.astype(np.uint64, copy=False))
    if len(candidates) > SKETCH_SIZE:
        candidates = np.partition(candidates, SKETCH_SIZE)[:SKETCH_SIZE]
    return np.unique(np.concatenate([sketch, candidates]))[:SKETCH_SIZE]


def distinct_count(sketch: np.ndarray) -> int:
    """The number of distinct values the sketch stands for (exact below SKETCH_SIZE)."""
    if len(sketch) < SKETCH_SIZE:
        return len(sketch)
    return int((SKETCH_SIZE - 1) * 2.0**64 / (float(sketch[-1]) + 1.0))


def identifies_rows(num_distinct: int, num_rows: int) -> bool:
    """Whether `num_distinct` values over `num_rows` non-null rows tell the rows apart."""
    return num_rows >= MIN_IDENTIFYING_ROWS and num_distinct >= IDENTIFYING_FRACTION * num_rows
