"""Which input rows reach a version: the one definition the scan (which counts them, so
the plan is exact) and the map stage (which writes them) share.

A row is left out when its label is null or NaN under `dataset.unlabelled: drop`, or when
a feature column under a `drop_row` null policy holds a null there
(preprocessing/scan/feature_stats.py: `null_rows`). Under `unlabelled: refuse` a null
label is the file's rejection instead (preprocessing/scan/columns.py: `row_problem`), so
no row of a refused file is read this far.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from preprocessing.config import DatasetSpec
from preprocessing.scan.feature_stats import column_nulls, drop_row_columns, null_rows


@dataclass(frozen=True)
class KeptRows:
    """Per row of a batch: kept, or left out; of those left out, which had no label."""

    kept: np.ndarray
    unlabelled: np.ndarray


def unlabelled_rows(table: pa.Table | pa.RecordBatch, spec: DatasetSpec) -> np.ndarray:
    """Rows whose label is null or NaN (NaN is a null label, as a NaN feature is a null)."""
    return column_nulls(table.column(spec.label_column))


def kept_rows(table: pa.Table | pa.RecordBatch, spec: DatasetSpec) -> KeptRows:
    """The rows of `table` that reach the version under `spec`."""
    unlabelled = (
        unlabelled_rows(table, spec)
        if spec.unlabelled == "drop"
        else np.zeros(table.num_rows, dtype=bool)
    )
    return KeptRows(~(unlabelled | null_rows(table, drop_row_columns(spec))), unlabelled)
