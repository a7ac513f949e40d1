"""Listing and scanning raw inputs: footers, the label/source/id columns, and the feature
columns the codec needs statistics of.

The listing of the inputs is `preprocessing/storage/sources.py: list_inputs`. `scan_file` (one
Dask task per file)
reads a file's footer, its label, source and id columns and its feature columns but
fixed-size lists free of nulls by the footer, and returns row counts per (piece, split,
class, source) of the rows a `drop_row` policy keeps, the feature columns' profiles
(preprocessing/scan/feature_stats.py) and the dropped rows, or the reason the file is rejected: a
missing or internal column name, a feature type no kind encodes, null or NaN labels,
null, duplicate or non-integer ids, too many label values, null fixed-size lists, bytes
that do not decode (preprocessing/scan/columns.py). Without `dataset.id_column` no id
column is read: ids are derived from each file's path and row (preprocessing/plan/row_ids.py).
Each file's scan is retried on transient errors (preprocessing/toolbox/faults.py); a file
still unreadable for one after every try comes back `transient`, which fails the run
rather than rejecting the file.
The checks across files (schemas, classes, duplicate ids, the manifest's codec) are
preprocessing/scan/across_files.py;
a batch's rows are counted by preprocessing/scan/row_counts.py.

Cost (1 M rows in 8 Parquet files, one process, a loaded 2-core machine): a 64-float
fixed-size-list sample scans in 0.5-0.7 s (0.2-0.4 s reading label and source only: the
difference is the id column and its uniqueness check); 20 scalar and 2 string feature
columns in 1.4-1.6 s (0.1-0.3 s), most of it decoding the feature columns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from preprocessing.config import DatasetSpec
from preprocessing.plan.counts import TRAIN, Counts
from preprocessing.plan.key_tally import KeyCounts, merge_keys, tally_keys
from preprocessing.plan.row_ids import id_range
from preprocessing.plan.split_keys import content_in_map, key_columns, key_hashes
from preprocessing.plan.time_cut import (
    TimeCells,
    TimeColumnError,
    TimeTally,
)
from preprocessing.plan.validation_split import splits_of
from preprocessing.scan.columns import INTERNAL_PREFIX as INTERNAL_PREFIX
from preprocessing.scan.columns import (
    IdTally,
    row_problem,
    schema_problem,
    too_many_classes,
)
from preprocessing.scan.content_pairs import ContentPairs, PairTally
from preprocessing.scan.feature_stats import (
    ColumnProfile,
    new_profiles,
    profile_batch,
)
from preprocessing.scan.kept_rows import kept_rows
from preprocessing.scan.row_counts import count_rows, count_times
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import (
    FORMATS,
    STREAM_BUFFER_BYTES,
    Footer,
    InputFile,
    file_format,
    footer_of,
    iter_batches,
    open_input,
    parquet_batches,
    stream_schema,
)
from preprocessing.toolbox.faults import (
    CorruptInput,
    PermanentInputError,
    RetryPolicy,
    call_with_retries,
    is_permanent,
)


@dataclass(frozen=True)
class FileScan:
    """The scan of one file: its schema and counts, or `reason` when it is rejected."""

    file: InputFile
    schema: pa.Schema | None = None
    piece_rows: list[int] = field(default_factory=list)
    counts: Counts = field(default_factory=lambda: Counts.of([]))
    reason: str | None = None
    transient: bool = False  # `reason` is an error that may pass: the file is not rejected
    profiles: dict[str, ColumnProfile] = field(default_factory=dict)
    dropped_rows: int = 0  # rows left out: unlabelled (under `unlabelled: drop`) or nulls
    unlabelled_rows: int = 0  # of them, rows without a label
    id_range: tuple[int, int] | None = None
    # With groups or duplicates set: distinct group / content hashes per split, with rows
    # (preprocessing/plan/key_tally.py), for the manifest's record of them.
    keys: KeyCounts = field(default_factory=dict)
    # The rows' size decoded: a Parquet footer's uncompressed bytes, a bound for text.
    decoded_bytes: int = 0
    # Under `holdout_by: newest`: rows per time cell (preprocessing/plan/time_cut.py), from
    # which the plan cuts the night; `counts` then hold every row as train until it does.
    time_cells: TimeCells | None = None
    # Under `duplicates: drop`: the file's content pairs as written (scan/content_pairs.py),
    # and once the night's reduce has run, its rows dropped per split (copies of earlier).
    content_pairs: ContentPairs | None = None
    duplicates_dropped: dict[str, int] = field(default_factory=dict)


def scan_file(
    file: InputFile,
    spec: DatasetSpec,
    seed: int,
    holdout_fraction: float,
    max_piece_rows: int,
    retry: RetryPolicy | None = None,
    pairs_dir: str | None = None,
) -> FileScan:
    """Count rows per (piece, split, class, source), trying again on transient errors; a
    file whose bytes do not decode is rejected with the reason, one still unreadable for
    a transient reason after every try comes back `transient` (never rejected), and any
    other permanent error (storage refusing, a config error) is raised. `pairs_dir`: the
    run's scratch, where under `duplicates: drop` the file's content pairs go."""
    policy = retry or RetryPolicy()
    try:
        return call_with_retries(
            _scan, file, spec, seed, holdout_fraction, max_piece_rows, pairs_dir, policy=policy
        )
    except Exception as error:
        kind = FORMATS.get("." + file.uri.rsplit(".", 1)[-1].lower(), "file")
        if isinstance(error, PermanentInputError):
            return FileScan(file, reason=f"unreadable {kind}: {_cause(error)}")
        if is_permanent(error):  # e.g. permission denied: the file is not bad, the run fails
            raise
        return FileScan(
            file,
            transient=True,
            reason=(
                f"not read after {policy.attempts} tries, for a reason that may pass: "
                f"{type(error).__name__}: {error}"
            ),
        )


def _cause(error: Exception) -> str:
    """The decoder's own error behind a `CorruptInput`, or the error itself."""
    cause = error.__cause__ if isinstance(error, CorruptInput) and error.__cause__ else error
    return f"{type(cause).__name__}: {cause}"


def _scan(
    file: InputFile,
    spec: DatasetSpec,
    seed: int,
    holdout_fraction: float,
    max_piece_rows: int,
    pairs_dir: str | None,
) -> FileScan:
    settings = (spec, seed, holdout_fraction, max_piece_rows, pairs_dir)
    if file_format(file.uri) != "parquet":
        reading = CsvReading.of(spec)
        return _scan_rows(
            file,
            None,
            stream_schema(file.uri, reading=reading),
            lambda columns: iter_batches(file.uri, columns, reading=reading),
            *settings,
        )
    with open_input(file.uri) as source:  # one open for the footer and the columns
        # Pages through a buffer, not every row group's chunks of the columns read ahead
        # (pyarrow's pre_buffer): a 64-float vector read to hash a row's content held all
        # of a 650 MB file's (857 -> 254 MB peak), the rest of the scan a few MB.
        parquet = pq.ParquetFile(source.reader, buffer_size=STREAM_BUFFER_BYTES, pre_buffer=False)
        footer = footer_of(parquet, max_piece_rows)
        return _scan_rows(
            file,
            footer,
            footer.schema,
            lambda columns: parquet_batches(source, parquet, columns),
            *settings,
        )


def _scan_rows(
    file: InputFile,
    footer: Footer | None,
    schema: pa.Schema,
    batches: Callable[[list[str]], Iterator[pa.RecordBatch]],
    spec: DatasetSpec,
    seed: int,
    holdout_fraction: float,
    max_piece_rows: int,
    pairs_dir: str | None,
) -> FileScan:
    """The scan of a file whose footer (Parquet) and schema are read: `batches(columns)`
    reads its rows."""
    if reason := schema_problem(schema, spec):
        return FileScan(file, schema, reason=reason)
    tally = _Tally(
        new_profiles(schema, spec.feature_columns, spec.date_columns),
        np.array(footer.piece_starts, dtype=np.int64) if footer else None,
        pairs=PairTally() if spec.duplicates == "drop" and pairs_dir else None,
    )
    columns = scan_columns(spec, tally.profiles, footer)
    if reason := _read_rows(
        tally, batches(columns), file, spec, seed, holdout_fraction, max_piece_rows
    ):
        return FileScan(file, schema, reason=reason)
    starts = tally.starts
    bounds = (
        np.r_[starts, tally.num_rows]
        if starts is not None
        else np.r_[np.arange(0, tally.num_rows, max_piece_rows), tally.num_rows]
    )
    return FileScan(
        file,
        schema,
        np.diff(bounds).tolist(),
        Counts.of((*key, n) for key, n in tally.counts.items()),
        profiles=tally.profiles,
        dropped_rows=tally.dropped,
        unlabelled_rows=tally.unlabelled,
        id_range=tally.id_range(file),
        keys=merge_keys(tally.keys),
        time_cells=tally.times.cells() if spec.holdout_by == "newest" else None,
        content_pairs=tally.pairs.write(pairs_dir, file) if tally.pairs and pairs_dir else None,
        decoded_bytes=(
            footer.decoded_bytes
            if footer
            else text_decoded_bytes(schema, tally.num_rows, file.num_bytes)
        ),
    )


def text_decoded_bytes(schema: pa.Schema, rows: int, stored_bytes: int) -> int:
    """A bound on the decoded size of a text file (CSV, JSON lines), which has no footer:
    its bytes (a string's or nested value's contents are no longer decoded than written)
    plus, a row, each fixed-width column's width and 8 bytes (an offset) for any other.
    A one-digit integer and its comma, 2 bytes, decode to 8: the widths cover that."""
    widths = 0
    for arrow_field in schema:
        try:
            widths += max(1, arrow_field.type.bit_width // 8)
        except ValueError:  # not fixed-width: strings, lists, structs
            widths += 8
    return stored_bytes + rows * widths


def _read_rows(
    tally: _Tally,
    batches: Iterator[pa.RecordBatch],
    file: InputFile,
    spec: DatasetSpec,
    seed: int,
    holdout_fraction: float,
    max_piece_rows: int,
) -> str | None:
    """Read the scan's columns into `tally`; the reason to reject the file, or None."""
    try:
        for batch in batches:
            if reason := row_problem(batch, spec, tally.num_rows):
                return reason
            tally.add(batch, file, spec, seed, holdout_fraction, max_piece_rows)
    except CorruptInput as error:
        if "Expected all lists to be of size" not in str(error):
            raise
        return _null_lists_reason(tally.profiles, error.__cause__ or error)
    except TimeColumnError as error:  # not a date, or a string that does not parse as one
        return str(error)
    if tally.num_rows == 0:
        return "empty file (0 rows)"
    return tally.problem(spec)


@dataclass
class _Tally:
    """What the scan of one file accumulates over its batches."""

    profiles: dict[str, ColumnProfile]
    starts: np.ndarray | None  # first row of each piece (Parquet); None: fixed-size pieces
    counts: Counter[tuple[int, str, Any, Any]] = field(default_factory=Counter)
    num_rows: int = 0
    dropped: int = 0
    unlabelled: int = 0
    ids: IdTally = field(default_factory=IdTally)
    keys: list[KeyCounts] = field(default_factory=list)
    times: TimeTally = field(default_factory=TimeTally)
    pairs: PairTally | None = None  # under `duplicates: drop`

    def add(
        self,
        batch: pa.RecordBatch,
        file: InputFile,
        spec: DatasetSpec,
        seed: int,
        holdout_fraction: float,
        max_piece_rows: int,
    ) -> None:
        """Count the batch's kept rows (preprocessing/scan/kept_rows.py: so the plan is
        exact) and fold its feature columns into the profiles: statistics of the kept
        training rows (held-out rows stay unseen), nulls of every row."""
        rows = np.arange(self.num_rows, self.num_rows + batch.num_rows)
        pieces = (
            np.searchsorted(self.starts, rows, side="right") - 1
            if self.starts is not None
            else rows // max_piece_rows
        )
        # Each hash once, for the split and the tally (the content's in the exchange when
        # it decides no split: split_keys.content_in_map).
        keys = key_hashes(batch, spec, tally=not content_in_map(spec))
        first, name = self.num_rows, file.relative_path
        splits = splits_of(keys, spec, name, first, batch.num_rows, seed, holdout_fraction)
        rows_kept = kept_rows(batch, spec)
        kept = rows_kept.kept
        profile_batch(self.profiles, batch, kept & (splits == TRAIN))
        table = pa.Table.from_batches([batch])
        if not kept.all():
            table, (pieces, splits, rows) = (
                table.filter(pa.array(kept)),
                _at(kept, pieces, splits, rows),
            )
            keys = {kind: hashes[kept] for kind, hashes in keys.items()}
        self.counts.update(count_rows(table, spec, file, pieces, splits))
        if self.pairs is not None:
            self.pairs.add(keys["content"], rows, splits, table, spec, file)
        self.keys.append(tally_keys(keys, splits))
        if spec.holdout_by == "newest" and spec.holdout_column:
            kept_part = (table, pieces, kept)
            count_times(self.times, batch, kept_part, file, spec, seed, self.num_rows)
        if spec.id_column:  # derived ids are unique by construction (plan/row_ids.py)
            self.ids.add(batch.column(spec.id_column).to_numpy(zero_copy_only=False))
        self.num_rows += batch.num_rows
        self.dropped += int((~kept).sum())
        self.unlabelled += int(rows_kept.unlabelled.sum())

    def problem(self, spec: DatasetSpec) -> str | None:
        """Too many classes or duplicate ids in this file, as a reason; else None."""
        labels = {key[2] for key in self.counts}
        if len(labels) > spec.max_classes:
            return too_many_classes(spec, len(labels))
        repeated = self.ids.repeated()
        if repeated.size and self.pairs is not None:  # `drop`: checked on the rows it keeps
            self.pairs.repeated_ids = True
        elif repeated.size:
            return (
                f"column '{spec.id_column}' holds {len(np.unique(repeated))} duplicate "
                f"ids (e.g. {repeated[0]}); ids must be unique"
            )
        return None

    def id_range(self, file: InputFile) -> tuple[int, int]:
        """The file's lowest and highest id: of its id column, or of the ids derived."""
        if self.ids.low is None or self.ids.high is None:
            return id_range(file.relative_path, self.num_rows)
        return self.ids.low, self.ids.high


def _null_lists_reason(profiles: dict[str, ColumnProfile], error: BaseException) -> str:
    lists = [name for name, profile in profiles.items() if profile.kind == "vector"]
    return (
        f"fixed-size list columns {lists} hold null lists, which pyarrow cannot read "
        f"back (docs/architecture.md M20: {error}): write the file with those rows "
        "dropped or their lists filled"
    )


def scan_columns(
    spec: DatasetSpec, profiles: dict[str, ColumnProfile], footer: Footer | None
) -> list[str]:
    """The columns the scan reads: label, source and id, those that decide a row's split
    (preprocessing/plan/split_keys.py), and the feature columns that need statistics; a
    fixed-size list whose footer shows no nulls is not read unless it decides a split."""
    columns = [
        spec.label_column,
        *([spec.source_column] if spec.source_column else []),
        *([spec.id_column] if spec.id_column else []),
        *key_columns(spec),
        *([spec.holdout_column] if spec.holdout_column else []),
    ]
    columns += [
        name
        for name, profile in profiles.items()
        if not (
            profile.kind == "vector" and footer is not None and footer.null_counts.get(name) == 0
        )
    ]
    return list(dict.fromkeys(columns))


def _at(mask: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(array[mask] for array in arrays)
