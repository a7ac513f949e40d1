"""The validation split beside a time holdout (`holdout_by: newest` with
`validation_fraction`, preprocessing/plan/time_cut.py): the newest rows the holdout
leaves, cut from the same tallies, so train < validation < holdout in time. Pure, and on
real Parquet files scanned and routed as a run scans and routes them, over hostile times
(ties, one distinct time, every row in one bucket, coarse levels, ISO strings without a
zone, tiny fractions, fractions adding up to nearly 1)."""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import astuple
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.plan.counts import HOLDOUT, SPLITS, TRAIN, VALIDATION
from preprocessing.plan.time_cut import (
    NO_HOLDOUT,
    SLICES,
    TimeCells,
    TimeCut,
    choose_cut,
    row_times,
    split_counts,
)
from preprocessing.plan.validation_split import row_splits
from preprocessing.scan.across_files import time_cut_of, with_time_cut
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import read_rows
from tests.preprocessing.test_time_cut import nights, scanned, time_spec

# (holdout, validation) fractions: tiny ones, and pairs adding up to nearly 1.
FRACTIONS = st.one_of(
    st.tuples(st.floats(0.0, 0.9), st.floats(0.0, 1.0)).map(
        lambda pair: (pair[0], pair[1] * (1.0 - pair[0]) * 0.999)
    ),
    st.tuples(st.floats(1e-6, 1e-3), st.floats(1e-6, 1e-3)),
    st.floats(0.0, 0.998).map(lambda held: (held, 0.999 - held)),
)


def routed_codes(scan, file, spec: DatasetSpec, cut: TimeCut, seed: int, fraction: float):
    """Each row's split code as every route gives it: piece by piece, as `read_piece`."""
    parts, first = [], 0
    for rows in scan.piece_rows:
        table = read_rows(file.uri, first, rows, reading=CsvReading.of(spec))
        parts.append(row_splits(table, spec, file.relative_path, first, seed, fraction, cut))
        first += rows
    return np.concatenate(parts)


@settings(max_examples=120, deadline=None)
@given(nights(), st.integers(0, 2**32), FRACTIONS)
def test_train_validation_holdout_follow_in_time_and_counts_are_exact(night, seed, fractions):
    """Invariant: for any times, types, files, pieces and fractions, the counts the plan
    reads equal, per piece, split and class, the rows every route puts in each split; no
    train row's bucket is newer than the oldest validation row's, no validation row's
    newer than the oldest holdout row's (a cutoff bucket's ties split by their slice);
    the oldest cell stays in train; the cut does not depend on the order of the files;
    the validation rows are the nearest to their fraction that a cell boundary allows."""
    table, cuts, _ = night
    holdout, validation = fractions
    ReshardConfig(output_root="out", holdout_fraction=holdout, dataset=time_spec(validation))
    spec = time_spec(validation)
    with tempfile.TemporaryDirectory() as folder:
        files, scans = scanned(Path(folder), table, cuts, seed, holdout)
        cut = time_cut_of(scans, spec, holdout)
        assert cut is not None and cut == time_cut_of(scans[::-1], spec, holdout)
        counted, seen, codes, times = Counter(), Counter(), [], []
        for scan, file in zip(with_time_cut(scans, spec, holdout), files, strict=True):
            counted.update({(file.uri, *r[:3]): r[4] for r in scan.counts.records()})
            split = routed_codes(scan, file, spec, cut, seed, holdout)
            labels = pq.read_table(file.uri).column("label").to_pylist()
            pieces = np.repeat(np.arange(len(scan.piece_rows)), scan.piece_rows)
            for piece, code, label in zip(pieces.tolist(), split.tolist(), labels, strict=True):
                seen[file.uri, piece, SPLITS[code], label] += 1
            codes.append(split)
            times.append(row_times(pq.read_table(file.uri).column("seen"), "seen"))
    assert +counted == +seen
    _assert_ordered(np.concatenate(codes), np.concatenate(times) >> cut.level)
    cells = [scan.time_cells for scan in scans]
    held = int((np.concatenate(codes) == VALIDATION).sum())
    _assert_validation_nearest(cells, cut, held, validation)


def _assert_ordered(codes: np.ndarray, buckets: np.ndarray) -> None:
    """Train, validation, holdout follow in time, bucket by bucket; train is never empty."""
    assert (codes == TRAIN).any() or len(codes) == 0, "the oldest cell stays in train"
    for older, newer in ((TRAIN, VALIDATION), (VALIDATION, HOLDOUT), (TRAIN, HOLDOUT)):
        if (codes == older).any() and (codes == newer).any():
            assert buckets[codes == older].max() <= buckets[codes == newer].min()


def _assert_validation_nearest(
    cells: list[TimeCells], cut: TimeCut, rows: int, fraction: float
) -> None:
    """No other start at a cell before the holdout's cutoff (the oldest kept in train)
    gives a validation split nearer `validation_fraction` of all rows."""
    values = np.concatenate([part.cells_at(cut.level) for part in cells])
    counts = np.concatenate([part.rows["num_rows"] for part in cells])
    distinct = np.unique(values)
    options = [int(counts[(values >= c) & (values < cut.cutoff)].sum()) for c in distinct[1:]]
    options = [*options, 0]
    assert rows in options
    target = fraction * int(counts.sum())
    assert abs(rows - target) <= min(abs(o - target) for o in options) + 1e-9


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.integers(0, SLICES - 1), st.integers(1, 50)),
        min_size=1,
        max_size=60,
    ),
    st.integers(0, 3),
    st.sampled_from([0, 3, 20, 40]),
    FRACTIONS,
)
def test_cells_at_coarse_levels_cut_in_time_order_with_exact_counts(
    records, files, level, fractions
) -> None:
    """Invariant: whatever the cells (one bucket, one cell, ties in every slice) and the
    level the files were counted at (a coarse one included, files at different levels
    taken to the coarsest), the counts per split are exactly the rows of its cells, and
    train < validation < holdout cell by cell; the oldest cell is train; the holdout's
    cutoff is the one chosen without a validation split (adding one moves no held row);
    the cut is the same whichever order the files come in."""
    holdout, validation = fractions
    parts = [
        TimeCells.of(
            level + index,
            {
                (0, bucket * SLICES + tie, "a", "r"): rows
                for bucket, tie, rows in records[index :: files + 1]
            },
        )
        for index in range(files + 1)
    ]
    parts = [part for part in parts if len(part.rows)]
    cut = choose_cut(parts, holdout, validation)
    assert cut == choose_cut(parts[::-1], holdout, validation)
    values = np.concatenate([part.cells_at(cut.level) for part in parts])
    rows = np.concatenate([part.rows["num_rows"] for part in parts])
    totals = Counter()
    for part in parts:
        for _, split, _, _, count in split_counts(part, cut).records():
            totals[split] += count
    first = min(cut.validation, cut.cutoff)  # the oldest cell out of train
    expected = {
        "train": int(rows[values < first].sum()),
        "validation": int(rows[(values >= first) & (values < cut.cutoff)].sum()),
        "holdout": int(rows[values >= cut.cutoff].sum()),
    }
    assert +totals == +Counter(expected)
    assert (cut.level, cut.cutoff) == astuple(choose_cut(parts, holdout))[:2]
    codes = cut.cell_codes(values)
    assert set(codes[values == values.min()].tolist()) == {TRAIN}
    order = np.argsort(values, kind="stable")
    assert (np.diff([{TRAIN: 0, VALIDATION: 1, HOLDOUT: 2}[c] for c in codes[order]]) >= 0).all()
    if validation <= 0:
        assert cut.validation == NO_HOLDOUT
