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

Under a time holdout (`holdout_by: newest`) the rule is time: the validation rows are the
newest the holdout leaves, the cells just older than its cutoff (plan/time_cut.py), so
train < validation < holdout in time, as a time-series split orders them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from preprocessing.config import DatasetSpec
from preprocessing.plan.counts import VALIDATION
from preprocessing.plan.permutation import derive_key, unit_interval
from preprocessing.plan.split_keys import held_out, key_hashes
from preprocessing.plan.time_cut import TimeCut, row_times, tie_slices


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
    (which moves the rows, through `row_splits`) make. Under a time holdout every row
    reads as train here: the scan counts time cells, the plan cuts (`time_splits`)."""
    if spec.holdout_by == "newest":
        return np.zeros(num_rows, dtype=np.int8)
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
    under `holdout_by: newest` with a holdout or validation split, the night's time `cut`
    decides (`time_splits`)."""
    if spec.holdout_by == "newest" and (holdout_fraction > 0 or spec.validation_fraction > 0):
        return time_splits(table, spec, file_key, first_row, seed, cut)
    drawn = holdout_fraction > 0 or spec.validation_fraction > 0
    keys = key_hashes(table, spec, tally=False) if drawn else {}
    return splits_of(keys, spec, file_key, first_row, table.num_rows, seed, holdout_fraction)


def time_splits(
    table: pa.Table | pa.RecordBatch,
    spec: DatasetSpec,
    file_key: str,
    first_row: int,
    seed: int,
    cut: TimeCut | None,
) -> np.ndarray:
    """The split code of every row of `table` by its time cell under the night's `cut`
    (plan/time_cut.py): holdout, validation just older, train older still."""
    if cut is None:
        raise ValueError("a time holdout routes rows only by the night's cut")
    column = spec.holdout_column or ""
    times = row_times(table.column(column), column)
    return cut.codes(times, tie_slices(file_key, first_row, table.num_rows, seed))
