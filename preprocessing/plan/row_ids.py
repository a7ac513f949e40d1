"""Row ids ballast derives when the inputs have none (`dataset.id_column` unset).

A row's id is a function of its file's path relative to the input root it was listed
from and its index in that file (before any `drop_row` null policy drops it): the same
on every rerun, whatever the cluster's shape or how the files are cut into pieces, and
the same when the files are listed through another URI prefix (`s3://bucket/raw` or its
local copy) or when new files are appended to an incremental chain (a file's path and
rows do not change). It is the key the holdout draw uses too
(preprocessing/plan/row_fates.py). Each file's ids are one contiguous range, `base + row`
with `base` 62 bits of a hash of the path, so a file's ids are unique by construction and
two files can share an id only if their ranges overlap, which the scan sees from the
ranges alone (two roots holding the same relative path, or a 1 in ~2^40 accident) and
refuses. Renaming a file within its root gives its rows new ids.

With an id column, `shared_id` is the rule the check across files applies to the ids it
reads (preprocessing/scan/across_files.py: `duplicate_ids`): which two rows share an id,
leaving alone a pair that an earlier night's files both hold (checked on their night).
"""

from __future__ import annotations

import hashlib

import numpy as np

DERIVED_ID_COLUMN = "__ballast_row_id"  # the internal prefix: no input column can take it


def id_base(relative_path: str) -> int:
    """The first id of a file: 62 bits of a hash of its path (ids stay positive int64)."""
    digest = hashlib.blake2b(f"ballast-row-id\0{relative_path}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") >> 2


def derived_ids(relative_path: str, first_row: int, num_rows: int) -> np.ndarray:
    """int64 ids of rows [first_row, first_row + num_rows) of a file."""
    return np.arange(first_row, first_row + num_rows, dtype=np.int64) + id_base(relative_path)


def id_range(relative_path: str, num_rows: int) -> tuple[int, int]:
    """The lowest and highest derived id of a file of `num_rows` rows."""
    base = id_base(relative_path)
    return base, base + max(num_rows, 1) - 1


def shared_id(ids: np.ndarray, owners: np.ndarray, committed: np.ndarray) -> tuple[int, int] | None:
    """Positions of two entries of `ids` that are equal, in `owners` order (`owners`: each
    entry's file, ascending), where not both files are `committed` (a bool per file: an
    earlier night's); None if no such pair. The first is the first entry of that id (the
    copy an earlier night kept, where it is one), the second the first after it that
    makes a pair: in a run of equal ids, the first neighbour pair to qualify holds it."""
    order = np.argsort(ids, kind="stable")  # equal ids stay in (file, row) order
    ordered = ids[order]
    same = np.flatnonzero(ordered[1:] == ordered[:-1])
    pairs = ~(committed[owners[order[same]]] & committed[owners[order[same + 1]]])
    clash = np.flatnonzero(pairs)
    if not clash.size:
        return None
    at = same[clash[0]]
    return int(order[np.searchsorted(ordered, ordered[at])]), int(order[at + 1])
