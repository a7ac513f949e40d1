"""Row counts per (piece, split, label, source) and the plan's per-piece offsets, columnar.

A scan returns its file's counts as one structured numpy array (piece, split code, label
code, source code, rows) with the file's label and source values; the driver joins the
files' arrays into one table over global pieces (`concat_counts`) and the plan keeps each
piece's within-stratum offsets in compressed rows (`PieceOffsets`). At 1e6 pieces the
Python objects they replace (a tuple per record, a dict per piece) held 3.8 GB of the
driver and took most of its 120 s; these hold about 0.3 GB (benchmarks/RESULTS.md M18).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any

import numpy as np

# A row's split code is its split's index here. One byte, as the holdout flag it replaced
# (train 0, holdout 1): counts kept by an earlier run read the same.
SPLITS = ("train", "holdout", "validation")
TRAIN, HOLDOUT, VALIDATION = (SPLITS.index(name) for name in SPLITS)  # split codes
COUNT_DTYPE = np.dtype(
    [
        ("piece", np.int64),
        ("split", np.int8),
        ("label", np.int32),
        ("source", np.int32),
        ("num_rows", np.int64),
    ]
)


@dataclass(frozen=True)
class Counts:
    """`rows` (COUNT_DTYPE, in piece order): `num_rows` rows of `piece` are in split
    `SPLITS[split]` and have label `labels[label]` and source `sources[source]`. The records
    are kept as their bytes, `packed`: a million files' tables then pickle about 5 us
    faster each (a small array's pickle costs 7 us) and hold 80 bytes less."""

    packed: bytes | bytearray
    labels: tuple[Any, ...]
    sources: tuple[Any, ...]

    @property
    def rows(self) -> np.ndarray:
        """The records (read-only when `packed` is bytes)."""
        return np.frombuffer(self.packed, dtype=COUNT_DTYPE)

    @classmethod
    def of(cls, records: Iterable[tuple[int, str, Any, Any, int]]) -> Counts:
        """The table of (piece, split, label, source, rows) records (piece order kept
        stable)."""
        labels: dict[Any, int] = {}
        sources: dict[Any, int] = {}
        items = [
            (
                piece,
                SPLITS.index(split),
                labels.setdefault(label, len(labels)),
                sources.setdefault(source, len(sources)),
                n,
            )
            for piece, split, label, source, n in records
        ]
        rows = np.array(items, dtype=COUNT_DTYPE) if items else np.zeros(0, COUNT_DTYPE)
        rows = rows[np.argsort(rows["piece"], kind="stable")]
        return cls(rows.tobytes(), tuple(labels), tuple(sources))

    def records(self) -> list[tuple[int, str, Any, Any, int]]:
        """The table as (piece, split, label, source, rows) records."""
        return [
            (piece, SPLITS[split], self.labels[label], self.sources[source], n)
            for piece, split, label, source, n in self.rows.tolist()
        ]

    def rows_by(self, column: str) -> dict[Any, int]:
        """Rows per label (`column="label"`) or per source, over every split."""
        values = self.labels if column == "label" else self.sources
        totals = np.bincount(
            self.rows[column], weights=self.rows["num_rows"], minlength=len(values)
        )
        return {value: int(n) for value, n in zip(values, totals.tolist(), strict=True)}


def concat_counts(parts: Sequence[Counts], first_pieces: np.ndarray) -> Counts:
    """One table over global pieces: part i's pieces start at `first_pieces[i]`, and its
    label and source codes index values shared by every part (in order of first sight)."""
    tables = list(map(attrgetter("packed"), parts))
    lengths = np.fromiter(map(len, tables), np.int64, len(tables)) // COUNT_DTYPE.itemsize
    # One join of the parts' bytes (`np.concatenate` of a million structured arrays spent
    # 11 s promoting their dtypes pair by pair); a bytearray, so the rows are writable.
    packed = bytearray().join(tables)
    rows = np.frombuffer(packed, dtype=COUNT_DTYPE)
    rows["piece"] += np.repeat(np.asarray(first_pieces, dtype=np.int64), lengths)
    labels, rows["label"] = _shared_codes([part.labels for part in parts], rows["label"], lengths)
    sources, rows["source"] = _shared_codes(
        [part.sources for part in parts], rows["source"], lengths
    )
    return Counts(packed, labels, sources)


def _shared_codes(
    values_of: list[tuple[Any, ...]], codes: np.ndarray, lengths: np.ndarray
) -> tuple[tuple[Any, ...], np.ndarray]:
    """Values shared by every part, and each row's code into them (rows part by part)."""
    values = list(chain.from_iterable(values_of))
    shared = {value: code for code, value in enumerate(dict.fromkeys(values))}
    value_codes = np.fromiter(map(shared.__getitem__, values), np.int32, len(values))
    sizes = np.fromiter(map(len, values_of), np.int32, len(values_of))
    first = np.cumsum(sizes, dtype=np.int32) - sizes  # int32: a row's temporaries are 8 bytes
    return tuple(shared), value_codes[np.repeat(first, lengths) + codes]


@dataclass(frozen=True)
class SplitCounts:
    """One split's records in piece order; `stratum` indexes `strata`."""

    strata: list[tuple[Any, Any]]
    piece: np.ndarray
    stratum: np.ndarray
    num_rows: np.ndarray
    num_pieces: int

    def stratum_rows(self) -> np.ndarray:
        """Input rows of each stratum."""
        totals = np.bincount(self.stratum, weights=self.num_rows, minlength=len(self.strata))
        return totals.astype(np.int64)  # float64 sums are exact below 2**53 rows


# A run of pieces' offsets as `PieceOffsets.flat` gives them: (starts, strata, offsets).
OffsetLists = tuple[list[int], list[int], list[int]]


@dataclass(frozen=True)
class PieceOffsets:
    """Within-stratum index of each piece's first row of each stratum, as compressed rows:
    piece p's entries are `[starts[p], starts[p + 1])` of `strata` and `offsets`."""

    starts: np.ndarray
    strata: np.ndarray
    offsets: np.ndarray

    @classmethod
    def empty(cls) -> PieceOffsets:
        return cls(
            np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64)
        )

    def flat(self, first: int, stop: int) -> OffsetLists:
        """Pieces [first, stop)'s entries as lists: a million map tasks' descriptors pickle
        lists of ints about 10x faster than small arrays (0.6 against 7 us each)."""
        low, high = int(self.starts[first]), int(self.starts[stop])
        return (
            self.starts[first : stop + 1].tolist(),
            self.strata[low:high].tolist(),
            self.offsets[low:high].tolist(),
        )

    def of_piece(self, piece: int) -> dict[int, int]:
        """One piece's offsets, by stratum."""
        low, high = int(self.starts[piece]), int(self.starts[piece + 1])
        return dict(
            zip(self.strata[low:high].tolist(), self.offsets[low:high].tolist(), strict=True)
        )


def dense_offsets(flat: OffsetLists, num_strata: int) -> np.ndarray:
    """[piece, stratum] offsets of a run of pieces from `PieceOffsets.flat` (0 where a
    piece has no rows of a stratum)."""
    starts, strata, offsets = (np.array(part, dtype=np.int64) for part in flat)
    dense = np.zeros((len(starts) - 1, num_strata), dtype=np.int64)
    dense[np.repeat(np.arange(len(starts) - 1), np.diff(starts)), strata] = offsets
    return dense


def small_ints(values: np.ndarray) -> np.ndarray:
    """`values` as uint16 when they fit: numpy's stable sort is then a radix sort, several
    times faster than the merge sort it uses for 64-bit integers."""
    if len(values) and values.min() >= 0 and values.max() < 1 << 16:
        return values.astype(np.uint16)
    return values


def piece_offsets(counts: SplitCounts) -> PieceOffsets:
    """Running totals of each stratum's rows over the pieces in order, before each piece."""
    by_stratum = np.argsort(small_ints(counts.stratum), kind="stable")  # records in piece order
    rows = counts.num_rows[by_stratum]
    before = np.cumsum(rows)
    before -= rows  # rows of earlier strata, then of this stratum in earlier pieces
    del rows
    stratum_rows = counts.stratum_rows()
    before -= (np.cumsum(stratum_rows) - stratum_rows)[counts.stratum[by_stratum]]
    offsets = np.empty(len(before), dtype=np.int64)
    offsets[by_stratum] = before
    starts = np.searchsorted(counts.piece, np.arange(counts.num_pieces + 1))
    return PieceOffsets(starts.astype(np.int64), counts.stratum.astype(np.int32), offsets)
