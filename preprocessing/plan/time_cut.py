"""A time holdout (`dataset.holdout_by: newest`): the newest rows by
`dataset.holdout_column` held out, decided from counts the scan already takes.

A row's time is its column's value in microseconds since the epoch, UTC (a date at its
midnight; ISO 8601 strings read as `ballast init` and the codec read them, a string
without a zone as UTC). Its *cell* is `(time >> level) * SLICES + slice`: a bucket of
2**level microseconds, then one of SLICES ties by a seeded hash of (file, row index). The
scan counts rows per (piece, cell, label, source) at the level its file needs (`TimeTally`:
level 0, a microsecond, until a file holds more than MAX_BUCKETS distinct buckets, then
twice as coarse each step), so the counts stay bounded whatever the rows. The plan takes
every file to the coarsest level of the night and holds out the newest cells whose rows
come closest to `holdout_fraction` (`choose_cut`), the oldest cell always kept for train;
the counts per split are then exact (`split_counts`), and every route of the exchange
routes a row by the same cell (`TimeCut.codes`). So no train row's bucket is newer than
the holdout's oldest bucket; rows of the cutoff bucket are split by the hash. A date
column whose files hold at most MAX_BUCKETS days each is cut at the day itself: equal
dates are the only ties. No pass over the rows is added: the scan reads one column more.
With `validation_fraction` the newest cells the holdout leaves, those whose rows come
closest to that fraction, go to validation (`TimeCut.validation`), chosen after the
holdout's cut, which they leave as it was: train < validation < holdout in time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from preprocessing.contract.column_spec import FeatureError, parse_timestamps
from preprocessing.plan.counts import HOLDOUT, SPLITS, TRAIN, VALIDATION, Counts
from preprocessing.plan.permutation import derive_key, unit_interval

SLICES = 8  # ties of a bucket, split by hash: the cutoff bucket is cut at 1/8 of it
MAX_BUCKETS = 256  # distinct buckets a file's counts keep before they coarsen
NO_HOLDOUT = np.iinfo(np.int64).max  # a cutoff no cell reaches
CELL_DTYPE = np.dtype(
    [
        ("piece", np.int64),
        ("cell", np.int64),
        ("label", np.int32),
        ("source", np.int32),
        ("num_rows", np.int64),
    ]
)
_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": 1}


class TimeColumnError(ValueError):
    """A holdout column whose values are no dates or timestamps."""


def row_times(column: pa.Array | pa.ChunkedArray, name: str) -> np.ndarray:
    """Microseconds since the epoch, UTC, of every value of holdout column `name` (nulls
    are the caller's to refuse first: they read as 0)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        try:
            column = parse_timestamps(column)
        except FeatureError as error:
            raise TimeColumnError(f"holdout column '{name}': {error}") from None
    kind = column.type
    if pa.types.is_date32(kind):
        days = column.cast(pa.int32()).fill_null(0).to_numpy(zero_copy_only=False)
        return days.astype(np.int64) * 86_400_000_000
    if pa.types.is_date64(kind) or pa.types.is_timestamp(kind):
        unit = "ms" if pa.types.is_date64(kind) else kind.unit
        stored = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        return stored // 1_000 if unit == "ns" else stored * _MICROS[unit]
    raise TimeColumnError(
        f"holdout column '{name}' is {kind}: dataset.holdout_column needs dates, "
        "timestamps or ISO 8601 strings"
    )


def tie_slices(file_key: str, first_row: int, num_rows: int, seed: int) -> np.ndarray:
    """The tie slice (0..SLICES-1) of rows `first_row`.. of file `file_key`."""
    rows = np.arange(first_row, first_row + num_rows, dtype=np.uint64)
    draws = unit_interval(rows, derive_key(seed, "holdout tie", file_key))
    return (draws * SLICES).astype(np.int64)


def row_cells(times: np.ndarray, slices: np.ndarray, level: int) -> np.ndarray:
    """Each row's cell at `level` (an arithmetic shift: a time before 1970 floors too)."""
    return (times >> level) * SLICES + slices


def coarser(cells: np.ndarray, steps: int) -> np.ndarray:
    """`cells` taken `steps` levels coarser (their buckets halved `steps` times)."""
    return ((cells // SLICES) >> steps) * SLICES + cells % SLICES


@dataclass
class TimeTally:
    """A file's rows per (piece, cell, label, source) as its scan reads them, at the
    finest level that keeps at most MAX_BUCKETS distinct buckets: CELL_DTYPE records,
    summed and sorted, with the label and source values their codes index."""

    level: int = 0
    records: np.ndarray = field(default_factory=lambda: np.zeros(0, CELL_DTYPE))
    labels: dict[Any, int] = field(default_factory=dict)
    sources: dict[Any, int] = field(default_factory=dict)

    def level_for(self, times: np.ndarray) -> int:
        """The finest level, no finer than the tally's, at which `times` (a batch) fall
        in at most MAX_BUCKETS buckets (fewer buckets at each coarser level: a bisection),
        so a batch is counted at most MAX_BUCKETS buckets wide."""
        low, high = self.level, 64
        if len(np.unique(times >> low)) <= MAX_BUCKETS:  # the usual case past a batch or two
            return low
        while low < high:
            middle = (low + high) // 2
            if len(np.unique(times >> middle)) <= MAX_BUCKETS:
                high = middle
            else:
                low = middle + 1
        return low

    def coarsen_to(self, level: int) -> None:
        if level > self.level:
            self.records["cell"] = coarser(self.records["cell"], level - self.level)
            self.level, self.records = level, summed(self.records)

    def add(self, batch: np.ndarray, labels: list[Any], sources: list[Any]) -> None:
        """Fold a batch's records (cells at `self.level`; label and source codes index
        `labels` and `sources`), coarsening while the file holds too many buckets."""
        batch = batch.copy()
        for name, values, known in (
            ("label", labels, self.labels),
            ("source", sources, self.sources),
        ):
            codes = np.array([known.setdefault(v, len(known)) for v in values], np.int32)
            batch[name] = codes[batch[name]] if len(codes) else batch[name]
        self.records = summed(np.concatenate([self.records, batch]))
        buckets = np.unique(self.records["cell"] // SLICES)
        level = self.level
        while len(np.unique(buckets >> (level - self.level))) > MAX_BUCKETS:
            level += 1
        self.coarsen_to(level)

    def cells(self) -> TimeCells:
        return TimeCells(
            self.level, self.records.tobytes(), tuple(self.labels), tuple(self.sources)
        )


def summed(records: np.ndarray) -> np.ndarray:
    """CELL_DTYPE `records` with one record per (piece, label, source, cell), in that order."""
    order = np.lexsort((records["cell"], records["source"], records["label"], records["piece"]))
    ordered = records[order]
    same = np.zeros(len(ordered), dtype=bool)  # as the record before it, in every key
    same[1:] = True
    for name in ("piece", "label", "source", "cell"):
        same[1:] &= ordered[name][1:] == ordered[name][:-1]
    starts = np.flatnonzero(~same)
    result = ordered[starts]
    if len(starts):
        result["num_rows"] = np.add.reduceat(ordered["num_rows"], starts)
    return result


@dataclass(frozen=True)
class TimeCells:
    """A file's rows per (piece, cell at `level`, label, source), CELL_DTYPE records as
    bytes (`packed`) with the label and source values their codes index."""

    level: int
    packed: bytes
    labels: tuple[Any, ...]
    sources: tuple[Any, ...]

    @property
    def rows(self) -> np.ndarray:
        return np.frombuffer(self.packed, dtype=CELL_DTYPE)

    @classmethod
    def of(cls, level: int, counts: dict[tuple[int, int, Any, Any], int]) -> TimeCells:
        labels: dict[Any, int] = {}
        sources: dict[Any, int] = {}
        items = [
            (
                piece,
                cell,
                labels.setdefault(lab, len(labels)),
                sources.setdefault(src, len(sources)),
                n,
            )
            for (piece, cell, lab, src), n in sorted(counts.items(), key=lambda kv: kv[0][:2])
        ]
        rows = np.array(items, dtype=CELL_DTYPE) if items else np.zeros(0, CELL_DTYPE)
        return cls(level, rows.tobytes(), tuple(labels), tuple(sources))

    def cells_at(self, level: int) -> np.ndarray:
        """The records' cells at `level` (no finer than the records')."""
        return coarser(self.rows["cell"], level - self.level)


@dataclass(frozen=True)
class TimeCut:
    """Rows whose cell at `level` is at least `cutoff` are held out (none: NO_HOLDOUT);
    those from `validation` up to `cutoff` go to validation (none: NO_HOLDOUT)."""

    level: int
    cutoff: int
    validation: int = NO_HOLDOUT

    def codes(self, times: np.ndarray, slices: np.ndarray) -> np.ndarray:
        """Each row's split code (plan/counts.py: SPLITS) by its cell."""
        return self.cell_codes(row_cells(times, slices, self.level))

    def cell_codes(self, cells: np.ndarray) -> np.ndarray:
        """The split code of each cell at `level`: holdout from `cutoff`, validation
        from `validation` up to it, train before."""
        codes = np.where(cells >= self.validation, VALIDATION, TRAIN).astype(np.int8)
        codes[cells >= self.cutoff] = HOLDOUT
        return codes

    def record(self, column: str) -> dict[str, Any]:
        """What a manifest keeps of the cut, for `ballast verify` and a reader (the
        validation keys only when the night has a validation cut)."""
        record: dict[str, Any] = {"column": column, "level": self.level, "cutoff": self.cutoff}
        record["bucket_seconds"] = 2**self.level / 1e6
        if self.cutoff != NO_HOLDOUT:
            record["cutoff_bucket_start"] = bucket_start(self.cutoff, self.level)
        if self.validation != NO_HOLDOUT:
            record["validation_cutoff"] = self.validation
            record["validation_bucket_start"] = bucket_start(self.validation, self.level)
        return record


def bucket_start(cell: int, level: int) -> str:
    """The start of cell `cell`'s bucket at `level`, ISO 8601 (past the year 9999, which a
    manifest read as untrusted input may claim: its microseconds)."""
    microseconds = (cell // SLICES) << level
    try:
        return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=microseconds)).isoformat()
    except OverflowError:
        return f"{microseconds} us"


def choose_cut(
    cells: Sequence[TimeCells], fraction: float, validation_fraction: float = 0.0
) -> TimeCut:
    """The cut of a night's files: at their coarsest level, the newest cells whose rows
    come closest to `fraction` of all held out, then the newest cells left whose rows come
    closest to `validation_fraction` of all for validation (ties: the smaller split), the
    oldest cell always kept for train."""
    level = max((part.level for part in cells), default=0)
    values = np.concatenate([part.cells_at(level) for part in cells] or [np.zeros(0, np.int64)])
    rows = np.concatenate([part.rows["num_rows"] for part in cells] or [np.zeros(0, np.int64)])
    distinct, inverse = np.unique(values, return_inverse=True)
    if len(distinct) < 2:
        return TimeCut(level, NO_HOLDOUT)
    per_cell = np.bincount(inverse, weights=rows, minlength=len(distinct)).astype(np.int64)
    total = int(per_cell.sum())
    held = newest_cells(per_cell, fraction * total) if fraction > 0 else len(distinct)
    checked = newest_cells(per_cell[:held], validation_fraction * total)
    starts = np.r_[distinct, NO_HOLDOUT]  # cut at index i: cells i.. (len: none)
    validation = int(starts[checked]) if checked < held else NO_HOLDOUT
    return TimeCut(level, int(starts[held]), validation)


def newest_cells(per_cell: np.ndarray, target: float) -> int:
    """The first of the newest cells (index 1..len, len: none) whose rows (`per_cell`,
    oldest first) come closest to `target` (ties: the later start, fewer rows)."""
    if target <= 0 or len(per_cell) < 2:
        return len(per_cell)
    newest = np.cumsum(per_cell[::-1])[::-1]  # newest[i]: rows of cells i..
    candidates = np.r_[newest[1:], 0]  # a start at cell i + 1 (the last: none)
    miss = np.abs(candidates - target)
    return len(miss) - int(np.argmin(miss[::-1]))  # ties: the later start


def split_counts(cells: TimeCells, cut: TimeCut) -> Counts:
    """A file's counts per (piece, split, label, source) under `cut`, exact."""
    rows = cells.rows
    code = cut.cell_codes(cells.cells_at(cut.level)).astype(np.int64)
    width = (len(cells.labels) or 1) * (len(cells.sources) or 1)
    stratum = rows["label"].astype(np.int64) * (len(cells.sources) or 1) + rows["source"]
    splits = len(SPLITS)
    key = (rows["piece"] * splits + code) * width + stratum
    keys, inverse = np.unique(key, return_inverse=True)
    totals = np.bincount(inverse, weights=rows["num_rows"], minlength=len(keys)).astype(np.int64)
    rest, source = np.divmod(keys % width, len(cells.sources) or 1)
    piece, split = np.divmod(keys // width, splits)
    return Counts.of(
        (p, SPLITS[s], cells.labels[lab], cells.sources[src], n)
        for p, s, lab, src, n in zip(
            piece.tolist(),
            split.tolist(),
            rest.tolist(),
            source.tolist(),
            totals.tolist(),
            strict=True,
        )
    )
