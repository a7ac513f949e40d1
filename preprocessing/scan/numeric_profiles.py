"""The scan's statistics of many numeric columns at once: wide tables at Arrow's speed.

A numeric column profiled alone (preprocessing/scan/feature_stats.py) costs an Arrow cast,
a null mask, a filtered copy and two reductions, about 0.1 ms; on 5,000 columns that per-
column cost, not Parquet's decode, was the scan's (issue 58). Here the numeric columns of
one Arrow type are taken together, a slice of columns at a time: one `to_tensor` (a null
as NaN) transposed so that each column is a contiguous row, one null count per column,
and, for every column with no null among the kept rows, count, mean and squared
deviations reduced along the rows in one call each. numpy sums a row of a C-contiguous
matrix with the same pairwise summation as a 1-D array, so every statistic is bit for bit
the column path's (tests/preprocessing/test_numeric_profiles.py, over hostile values). A
column with nulls among the kept rows keeps its own rows: it is folded alone, from its
row of the matrix, without an Arrow call.

Exactly as on the column path: a 64-bit integer past 2**53 does not convert to float64
exactly (Arrow refuses the cast there), so a block of 64-bit integers is taken only when
it holds no null and every value is within 2**53; otherwise it goes column by column.
Integer columns' distinct-value sketches are hashed from each column's own values, as
the column path does (their dtype sets the hash).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.contract.numeric_block import BLOCK_TYPES, EXACT_INTEGERS
from preprocessing.plan.distinct import fold_hashes, value_hashes

if TYPE_CHECKING:
    from preprocessing.scan.feature_stats import ColumnProfile

# Fewer numeric columns of a type go one by one: a narrow table profiles as it did.
MIN_BLOCK_COLUMNS = 8
# The float64 matrix of one slice of columns stays under this: a 65,536-row batch of 5,000
# columns is never one 2.6 GB copy, and the temporaries of a slice are reused, not faulted
# in anew (a 5,000 x 1,000 matrix at once: 0.2 s a batch, most of it page faults).
SLICE_BYTES = 4 << 20


def numeric_blocks(
    profiles: dict[str, ColumnProfile], schema: pa.Schema, names: list[str]
) -> list[list[str]]:
    """The `names` of numeric columns grouped by Arrow type, for the types that have at
    least MIN_BLOCK_COLUMNS of them."""
    by_type: dict[pa.DataType, list[str]] = {}
    for name in names:
        arrow_type = schema.field(name).type
        if profiles[name].kind == "numeric" and arrow_type in BLOCK_TYPES:
            by_type.setdefault(arrow_type, []).append(name)
    return [block for block in by_type.values() if len(block) >= MIN_BLOCK_COLUMNS]


def fold_block(
    profiles: dict[str, ColumnProfile], batch: pa.RecordBatch, names: list[str], kept: np.ndarray
) -> bool:
    """Fold the columns `names` (numeric, one Arrow type) of `batch` into their profiles,
    as the column path would: null rows of every row, statistics of the `kept` non-null
    rows; False, with nothing folded, when they must go one by one (see the module)."""
    if not converts_exactly(batch, names):
        return False
    integers = pa.types.is_integer(batch.schema.field(names[0]).type)
    step = max(1, SLICE_BYTES // max(1, 8 * batch.num_rows))
    for start in range(0, len(names), step):
        part = names[start : start + step]
        numbers = column_matrix(batch.select(part))
        fold_numbers([profiles[name] for name in part], numbers, kept)
        if integers:
            fold_integer_hashes(profiles, batch, part, numbers, kept)
    return True


def converts_exactly(batch: pa.RecordBatch, names: list[str]) -> bool:
    """Whether every value of the columns converts to float64 exactly: always, but for
    64-bit integers, which must hold no null and no value past 2**53."""
    arrow_type = batch.schema.field(names[0]).type
    if not (pa.types.is_integer(arrow_type) and arrow_type.bit_width == 64):
        return True
    for name in names:
        column = batch.column(name)
        bounds = pc.min_max(column)
        if column.null_count or (
            len(column)
            and (bounds["max"].as_py() > EXACT_INTEGERS or bounds["min"].as_py() < -EXACT_INTEGERS)
        ):
            return False
    return True


def column_matrix(batch: pa.RecordBatch) -> np.ndarray:
    """float64 [columns, rows] of a batch of one numeric type, a null as NaN."""
    tensor = batch.to_tensor(null_to_nan=True, row_major=False)  # a column's values together
    return tensor.to_numpy().T.astype(np.float64, copy=False)


def fold_numbers(profiles: list[ColumnProfile], numbers: np.ndarray, kept: np.ndarray) -> None:
    """Fold each row of `numbers` (a column; NaN a null) into its profile: its null rows,
    and the count, mean and squared deviations of its kept non-null values."""
    nulls = np.isnan(numbers)
    counts = np.count_nonzero(nulls, axis=1)
    for profile, count in zip(profiles, counts.tolist(), strict=True):
        profile.null_rows += count
    # A column with a null among the kept rows is folded alone, over its own rows.
    gaps = (nulls & kept).any(axis=1) if counts.any() else np.zeros(len(profiles), bool)
    for index in np.flatnonzero(gaps).tolist():
        profiles[index].add_numbers(numbers[index][kept & ~nulls[index]])
    whole = np.flatnonzero(~gaps)
    if len(whole) and kept.any():
        rows = numbers if len(whole) == len(numbers) else numbers[whole]
        fold_moments([profiles[index] for index in whole.tolist()], rows, kept)


def fold_moments(profiles: list[ColumnProfile], numbers: np.ndarray, kept: np.ndarray) -> None:
    """Fold the `kept` values of each row of `numbers` (no NaN among them) into its profile."""
    values = numbers if kept.all() else numbers.compress(kept, axis=1)  # a column a row
    means = values.mean(axis=1)
    deviations = np.subtract(values, means[:, None])
    squares = np.square(deviations, out=deviations).sum(axis=1)
    for profile, mean, m2 in zip(profiles, means.tolist(), squares.tolist(), strict=True):
        profile.add_moments(values.shape[1], mean, m2)


def fold_integer_hashes(
    profiles: dict[str, ColumnProfile],
    batch: pa.RecordBatch,
    names: list[str],
    numbers: np.ndarray,
    kept: np.ndarray,
) -> None:
    """Each integer column's kept non-null values into its distinct-values sketch, hashed
    from the column's own numpy values as on the column path."""
    for index, name in enumerate(names):
        use = kept & ~np.isnan(numbers[index])
        values = batch.column(name).to_numpy(zero_copy_only=False)[use]
        profiles[name].hashes = fold_hashes(profiles[name].hashes, value_hashes(values))
