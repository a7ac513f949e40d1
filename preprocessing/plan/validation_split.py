"""Which rows go to the validation split: the rows training selects on (early stopping,
checkpoint choice), apart from the holdout that evaluation and promotion read.

A row's split is a code, its index in `SPLITS`: train 0, holdout 1, validation 2 (a holdout
mask as integers is a code array as it was). The holdout is drawn first, as it always was
(`plan.split_keys.held_out`), so adding a validation split changes no held-out row. Among
the rows left, a row goes to validation when a second keyed draw falls under
`validation_fraction / (1 - holdout_fraction)`, so the expected share of all rows is
`dataset.validation_fraction`. The second draw follows the same rules as the first: by
(seed, file, row index) by default, by the hash of the row's group or content when
`group_column` or `duplicates: same_split` is set, under a key of its own. Equal keys
draw alike, so a group or a duplicate content lies in one of the three splits, in any
file, piece or night. The draw comes before resampling, as the holdout's does: both are
kept as read, neither is over- or undersampled.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from preprocessing.config import DatasetSpec
from preprocessing.plan.counts import SPLITS
from preprocessing.plan.permutation import derive_key, unit_interval
from preprocessing.plan.split_keys import held_out, holdout_rows, key_hashes
from preprocessing.plan.time_cut import TimeCut

TRAIN, HOLDOUT, VALIDATION = (SPLITS.index(name) for name in ("train", "holdout", "validation"))


def validation_rows(
    keys: dict[str, np.ndarray],
    spec: DatasetSpec,
    file_key: str,
    first_row: int,
    holdout: np.ndarray,
    seed: int,
    holdout_fraction: float,
) -> np.ndarray:
    """True for the rows `first_row`.. of file `file_key` in the validation split: not in
    `holdout`, and under their own draw (from their `key_hashes` when the split follows a
    group or content)."""
    fraction = spec.validation_fraction
    if fraction <= 0:
        return np.zeros(len(holdout), dtype=bool)
    share = fraction / (1.0 - holdout_fraction)  # of the rows the holdout leaves
    value = keys.get("group") if spec.group_column else keys.get("content")
    if value is None:
        index = np.arange(first_row, first_row + len(holdout), dtype=np.uint64)
        draw = unit_interval(index, derive_key(seed, "validation", file_key))
    else:
        draw = unit_interval(value, derive_key(seed, "validation", "value"))
    return (draw < share) & ~holdout


def split_codes(holdout: np.ndarray, validation: np.ndarray) -> np.ndarray:
    """Each row's split code from its holdout and validation masks (disjoint)."""
    codes = holdout.astype(np.int8)
    codes[validation] = VALIDATION
    return codes


def splits_of(
    keys: dict[str, np.ndarray],
    spec: DatasetSpec,
    file_key: str,
    first_row: int,
    num_rows: int,
    seed: int,
    holdout_fraction: float,
) -> np.ndarray:
    """The split code of rows `first_row`.. of file `file_key` from their `key_hashes`:
    the one decision the scan (which counts the splits) and every route of the exchange
    (which moves the rows, through `row_splits`) make."""
    holdout = held_out(keys, spec, file_key, first_row, num_rows, seed, holdout_fraction)
    validation = validation_rows(keys, spec, file_key, first_row, holdout, seed, holdout_fraction)
    return split_codes(holdout, validation)


def row_splits(
    table: pa.Table | pa.RecordBatch,
    spec: DatasetSpec,
    file_key: str,
    first_row: int,
    seed: int,
    holdout_fraction: float,
    cut: TimeCut | None = None,
) -> np.ndarray:
    """The split code of every row of `table` (rows `first_row`.. of file `file_key`);
    under `holdout_by: newest` (never with a validation split: the config refuses it),
    the holdout is the night's time `cut` (`split_keys.holdout_rows`)."""
    if spec.holdout_by == "newest":
        held = holdout_rows(table, spec, file_key, first_row, seed, holdout_fraction, cut)
        return held.astype(np.int8)
    drawn = holdout_fraction > 0 or spec.validation_fraction > 0
    keys = key_hashes(table, spec, tally=False) if drawn else {}
    return splits_of(keys, spec, file_key, first_row, table.num_rows, seed, holdout_fraction)
