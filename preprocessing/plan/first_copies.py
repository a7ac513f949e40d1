"""Which copy of a duplicated row a night keeps under `dataset.duplicates: drop`: the first
by (file, in the order the plan lists the inputs; row number in its file).

Each file's scan keeps, per kept row, a *pair*: the row's content hash (plan/split_keys.py:
`key_hashes`), its row number and a code for its (split, label, source), sorted by hash
(`sorted_pairs`), with where each of BUCKETS ranges of the hash space starts in it
(`bucket_bounds`). A night's reduce then takes one range of buckets at a time from every
file (`bucket_groups`, at most about `budget_rows` pairs each unless one bucket holds
more), in file order, and marks every pair whose hash an earlier (file, row) holds
(`later_copies`): a hash range holds every copy of its contents, so each range is
decided alone and the memory held is a range's pairs, not the night's. Pure numpy.
"""

from __future__ import annotations

import numpy as np

BUCKETS = 256  # ranges of the hash space, by its top 8 bits
BUCKET_SHIFT = np.uint64(64 - 8)
PAIR_DTYPE = np.dtype([("hash", np.uint64), ("row", np.int64), ("stratum", np.int32)])


def sorted_pairs(hashes: np.ndarray, rows: np.ndarray, strata: np.ndarray) -> np.ndarray:
    """PAIR_DTYPE records of a file's kept rows (`rows` ascending, as a scan reads them),
    sorted by (hash, row): a stable sort by hash keeps equal hashes in row order (a sort
    by (hash, row) took 0.8 s a million rows, most of a file's added scan cost)."""
    order = np.argsort(hashes, kind="stable")
    pairs = np.empty(len(hashes), PAIR_DTYPE)
    pairs["hash"], pairs["row"], pairs["stratum"] = hashes[order], rows[order], strata[order]
    return pairs


def bucket_bounds(pairs: np.ndarray) -> np.ndarray:
    """Where each bucket's pairs start in `pairs` (sorted), and their end: BUCKETS + 1."""
    starts = np.arange(BUCKETS, dtype=np.uint64) << BUCKET_SHIFT
    return np.r_[np.searchsorted(pairs["hash"], starts), len(pairs)].astype(np.int64)


def bucket_groups(bucket_rows: np.ndarray, budget_rows: int) -> list[tuple[int, int]]:
    """[start, stop) runs of buckets whose pairs (`bucket_rows`: the night's per bucket)
    sum to at most `budget_rows`, or one bucket that alone holds more."""
    groups, start, held = [], 0, 0
    for bucket, rows in enumerate(bucket_rows.tolist()):
        if bucket > start and held + rows > budget_rows:
            groups.append((start, bucket))
            start, held = bucket, 0
        held += rows
    return [*groups, (start, len(bucket_rows))] if len(bucket_rows) else groups


def later_copies(parts: list[np.ndarray]) -> list[np.ndarray]:
    """Per part (one file's pairs of a range of hashes, sorted by (hash, row) as
    `sorted_pairs` leaves them; files in plan order), True for the pairs whose hash an
    earlier (file, row) holds: each copy but the first."""
    sizes = [len(part) for part in parts]
    if not sum(sizes):
        return [np.zeros(0, dtype=bool) for _ in parts]
    hashes = np.concatenate([part["hash"] for part in parts])
    # A stable sort by hash alone keeps equal hashes in (file, row) order: the parts are
    # in file order, each sorted by (hash, row). Timsort merges the parts' sorted runs
    # (a k-way merge), where a sort by (hash, file, row) took 3x as long.
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    later = np.zeros(len(hashes), dtype=bool)
    later[order[1:]] = ordered[1:] == ordered[:-1]
    return np.split(later, np.cumsum(sizes)[:-1])
