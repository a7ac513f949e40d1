"""Rows counted per (piece, split, label, source) in one vectorised pass over a batch (per
time cell in place of the split under a time holdout), and
the source of every row (its source column, or the input root it was listed from).

The scan (preprocessing/scan/inputs.py) counts every batch of a file so; the exchange's map
tasks (preprocessing/exchange/staged_rows.py) take the same sources of the rows they read.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.config import DatasetSpec
from preprocessing.plan.counts import SPLITS
from preprocessing.plan.time_cut import (
    CELL_DTYPE,
    TimeTally,
    row_cells,
    row_times,
    tie_slices,
)
from preprocessing.storage.sources import InputFile


def row_sources(table: pa.Table, spec: DatasetSpec, file: InputFile) -> pa.Array:
    """The source of every row: its source column, or the input root it was listed from."""
    if spec.source_column:
        return table.column(spec.source_column).combine_chunks()
    # One scalar repeated in Arrow: a Python list of the root's name cost 17 ms per 65,536
    # rows, in the scan and again in the map (0.18 ms so; benchmarks/RESULTS.md M37).
    return pa.repeat(pa.scalar(file.root, pa.string()), table.num_rows)


def count_rows(
    table: pa.Table, spec: DatasetSpec, file: InputFile, pieces: np.ndarray, splits: np.ndarray
) -> dict[tuple[int, str, Any, Any], int]:
    """Rows per (piece, split, label, source) of one batch (`splits`: each row's split code,
    plan/counts.py): one integer key per row and a numpy count (an Arrow group-by cost 3x
    more, mostly its per-call set-up)."""
    labels, label_codes = value_codes(table.column(spec.label_column))
    sources, source_codes = value_codes(row_sources(table, spec, file))
    split = splits.astype(np.int64)
    key = ((pieces * len(SPLITS) + split) * len(labels) + label_codes) * len(sources)
    key += source_codes
    keys, counts = _distinct_counts(key)
    rest, source = np.divmod(keys, len(sources))
    rest, label = np.divmod(rest, len(labels))
    piece, split = np.divmod(rest, len(SPLITS))
    columns = (part.tolist() for part in (piece, split, label, source, counts))
    return {
        (p, SPLITS[code], labels[lab], sources[src]): n
        for p, code, lab, src, n in zip(*columns, strict=True)
    }


def _distinct_counts(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(key, return_counts=True)`: a count over the keys' range where that is no
    larger than the batch (a batch's keys span a few pieces and classes), a pass instead
    of a sort."""
    low = int(key.min()) if len(key) else 0
    if len(key) and int(key.max()) - low < max(len(key), 1 << 10):
        counts = np.bincount(key - low)
        present = np.flatnonzero(counts)
        return present + low, counts[present]
    return np.unique(key, return_counts=True)


def value_codes(column: pa.Array | pa.ChunkedArray) -> tuple[list[Any], np.ndarray]:
    """The distinct values of `column` and each row's index into them."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column)
    return encoded.dictionary.to_pylist(), encoded.indices.to_numpy().astype(np.int64)


def count_cells(
    table: pa.Table, spec: DatasetSpec, file: InputFile, pieces: np.ndarray, cells: np.ndarray
) -> tuple[np.ndarray, list[Any], list[Any]]:
    """Rows per (piece, time cell, label, source) of one batch (preprocessing/plan/
    time_cut.py), as CELL_DTYPE records and the label and source values their codes
    index: `count_rows` with the row's time cell in place of its split."""
    labels, label_codes = value_codes(table.column(spec.label_column))
    sources, source_codes = value_codes(row_sources(table, spec, file))
    # Cells by their rank in the batch (a batch spans at most MAX_BUCKETS buckets): one
    # integer key a row, as `count_rows` keys them (a sort of (key, cell) pairs cost 13x).
    distinct, cell_codes = np.unique(cells, return_inverse=True)
    key = ((pieces * len(labels) + label_codes) * len(sources) + source_codes) * len(distinct)
    keys, counts = _distinct_counts(key + cell_codes.reshape(-1))
    records = np.zeros(len(keys), CELL_DTYPE)
    rest, cell = np.divmod(keys, len(distinct))
    rest, records["source"] = np.divmod(rest, len(sources))
    records["piece"], records["label"] = np.divmod(rest, len(labels))
    records["cell"], records["num_rows"] = distinct[cell], counts
    return records, labels, sources


def count_times(
    tally: TimeTally,
    batch: pa.RecordBatch,
    rows_kept: tuple[pa.Table, np.ndarray, np.ndarray],
    file: InputFile,
    spec: DatasetSpec,
    seed: int,
    first_row: int,
) -> None:
    """Count a batch's kept rows per time cell into `tally` (preprocessing/plan/
    time_cut.py): `rows_kept` is the kept rows' table, their pieces and the batch's mask
    of kept rows; the batch starts at row `first_row` of the file."""
    table, pieces, kept = rows_kept
    column = spec.holdout_column or ""
    times = row_times(batch.column(column), column)[kept]
    tally.coarsen_to(tally.level_for(times))
    slices = tie_slices(file.relative_path, first_row, batch.num_rows, seed)[kept]
    tally.add(*count_cells(table, spec, file, pieces, row_cells(times, slices, tally.level)))
