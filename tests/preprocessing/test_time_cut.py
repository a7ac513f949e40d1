"""The time holdout (`dataset.holdout_by: newest`, preprocessing/plan/time_cut.py), pure and
on real Parquet files scanned as a run scans them: whatever the times (ties, all equal,
before 1970, one row, dates, timestamps of any unit, ISO strings in mixed zones), the
counts the plan reads are exactly the rows every route holds out, no train row is in a
bucket newer than the holdout's oldest, and the holdout is the share of rows nearest the
fraction that whole cells allow."""

from __future__ import annotations

import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.plan.counts import HOLDOUT
from preprocessing.plan.time_cut import (
    CELL_DTYPE,
    MAX_BUCKETS,
    NO_HOLDOUT,
    SLICES,
    TimeCells,
    TimeColumnError,
    TimeTally,
    choose_cut,
    row_cells,
    row_times,
    split_counts,
)
from preprocessing.plan.validation_split import row_splits
from preprocessing.scan.across_files import time_cut_of, with_time_cut
from preprocessing.scan.columns import row_problem
from preprocessing.scan.inputs import FileScan, scan_file
from preprocessing.scan.scan_record import decode_scans, encode_scans
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import InputFile, read_rows
from preprocessing.toolbox.setting_marks import comparable_settings

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Seconds from the epoch: a few values (ties), a wide range, before 1970 included.
SECONDS = st.one_of(
    st.sampled_from([0, 1, 86_399, 86_400, 1_709_251_200, -86_400]),
    st.integers(-(2**33), 2**33),
)
KINDS = ["timestamp_us_utc", "timestamp_ns", "timestamp_s", "date32", "iso"]


def column_of(seconds: list[int], kind: str, zones: list[int]) -> pa.Array:
    """The times in one Arrow type; ISO strings written in the zone `zones[i]` hours off
    UTC (0: with `Z`, or naive, which reads as UTC), the same instants whatever the zone."""
    if kind == "date32":
        return pa.array([s // 86_400 for s in seconds], pa.date32())
    if kind == "iso":
        texts = []
        for value, zone in zip(seconds, zones, strict=True):
            moment = EPOCH + timedelta(seconds=value)
            if zone == 0:  # UTC written with `Z`, or naive (read as UTC)
                text = moment.strftime("%Y-%m-%dT%H:%M:%SZ" if value % 2 else "%Y-%m-%d %H:%M:%S")
            else:
                text = moment.astimezone(timezone(timedelta(hours=zone))).isoformat()
            texts.append(text)
        return pa.array(texts, pa.string())
    micros = pa.array([s * 1_000_000 for s in seconds], pa.int64())
    if kind == "timestamp_ns":
        return pa.array([s * 1_000_000_000 for s in seconds], pa.int64()).cast(pa.timestamp("ns"))
    if kind == "timestamp_s":
        return pa.array(seconds, pa.int64()).cast(pa.timestamp("s"))
    return micros.cast(pa.timestamp("us", tz="UTC"))


@st.composite
def nights(draw: st.DrawFn) -> tuple[pa.Table, list[int], str]:
    """A night's rows (label, feature, time) in one time type, cut into files."""
    size = draw(st.integers(1, 60))
    same = draw(st.booleans())  # all rows at one time
    seconds = (
        [draw(SECONDS)] * size if same else draw(st.lists(SECONDS, min_size=size, max_size=size))
    )
    kind = draw(st.sampled_from(KINDS))
    if kind == "timestamp_ns":  # nanoseconds since 1970 in an int64 reach only 2262
        seconds = [max(min(s, 2**32), -(2**32)) for s in seconds]
    zones = draw(st.lists(st.sampled_from([0, 1, -5, 9]), min_size=size, max_size=size))
    table = pa.table(
        {
            "label": draw(st.lists(st.integers(0, 2), min_size=size, max_size=size)),
            "x": np.arange(size, dtype=np.float64),
            "seen": column_of(seconds, kind, zones),
        }
    )
    cuts = sorted(draw(st.lists(st.integers(0, size), max_size=3)))
    return table, cuts, kind


def time_spec(validation: float = 0.0) -> DatasetSpec:
    return DatasetSpec(
        inputs=["raw"],
        source_column=None,
        feature_columns=["x"],
        holdout_by="newest",
        holdout_column="seen",
        validation_fraction=validation,
    )


def scanned(folder: Path, table: pa.Table, cuts: list[int], seed: int, fraction: float):
    """The table written as Parquet files cut at `cuts` (row groups of 4: pieces), each
    scanned as a run scans it (pieces of at most 3 rows where no row groups apply)."""
    files, scans = [], []
    for index, (start, stop) in enumerate(pairwise([0, *cuts, table.num_rows])):
        if stop == start:
            continue
        path = folder / f"f{index}.parquet"
        pq.write_table(table.slice(start, stop - start), path, row_group_size=4)
        file = InputFile(str(path), str(folder), path.name, path.stat().st_size, "t")
        files.append(file)
        scans.append(scan_file(file, time_spec(), seed, fraction, 3))
    return files, scans


def routed(scan: FileScan, file: InputFile, cut, seed: int, fraction: float) -> np.ndarray:
    """What every route holds out of a file: piece by piece, as `read_piece` reads them."""
    parts, first = [], 0
    for rows in scan.piece_rows:
        table = read_rows(file.uri, first, rows, reading=CsvReading.of(time_spec()))
        codes = row_splits(table, time_spec(), file.relative_path, first, seed, fraction, cut)
        parts.append(codes == HOLDOUT)
        first += rows
    return np.concatenate(parts)


@settings(max_examples=120, deadline=None)
@given(nights(), st.integers(0, 2**32), st.floats(0.01, 0.9))
def test_counts_are_exact_and_no_train_row_is_newer_than_the_holdout(night, seed, fraction):
    """Invariant: for any times, types, files and pieces, the counts the plan reads (the
    scan's time cells split by the night's cut) equal, per piece, split and class, the
    rows every route holds out; no train row's bucket is newer than the oldest holdout
    row's; dates are cut at the day, so no train date follows a holdout date; the held
    rows are the nearest to the fraction that a cut at a cell allows."""
    table, cuts, kind = night
    with tempfile.TemporaryDirectory() as folder:
        files, scans = scanned(Path(folder), table, cuts, seed, fraction)
        assert all(scan.reason is None for scan in scans), [s.reason for s in scans]
        cut = time_cut_of(scans, time_spec(), fraction)
        assert cut is not None
        counted, seen, held, times = Counter(), Counter(), [], []
        for scan, file in zip(with_time_cut(scans, time_spec(), fraction), files, strict=True):
            counted.update({(file.uri, *r[:3]): r[4] for r in scan.counts.records()})
            mask = routed(scan, file, cut, seed, fraction)
            labels = pq.read_table(file.uri).column("label").to_pylist()
            starts = np.repeat(np.arange(len(scan.piece_rows)), scan.piece_rows)
            for piece, hold, label in zip(starts.tolist(), mask.tolist(), labels, strict=True):
                seen[file.uri, piece, "holdout" if hold else "train", label] += 1
            held.append(mask)
            times.append(row_times(pq.read_table(file.uri).column("seen"), "seen"))
    assert +counted == +seen
    held_rows, all_times = np.concatenate(held), np.concatenate(times)
    buckets = all_times >> cut.level
    if held_rows.any() and (~held_rows).any():
        assert buckets[~held_rows].max() <= buckets[held_rows].min()
        if kind == "date32" and cut.level < 36:  # 2**36 us > a day: days stay apart
            assert all_times[~held_rows].max() <= all_times[held_rows].min()
    assert (~held_rows).any() or table.num_rows == 0, "the oldest cell stays in train"
    _assert_nearest(scans, cut, int(held_rows.sum()), fraction, table.num_rows)


def _assert_nearest(scans, cut, held: int, fraction: float, total: int) -> None:
    """No other cut at a cell boundary (the oldest cell kept) is nearer the fraction."""
    cells = [scan.time_cells for scan in scans]
    values = np.concatenate([part.cells_at(cut.level) for part in cells])
    rows = np.concatenate([part.rows["num_rows"] for part in cells])
    distinct = np.unique(values)
    options = [int(rows[values >= c].sum()) for c in distinct[1:]] + [0]
    assert abs(held - fraction * total) <= min(abs(o - fraction * total) for o in options) + 1e-9
    assert held in options


def test_iso_strings_in_any_zone_read_as_the_instant_and_bad_ones_name_the_column() -> None:
    """Invariant: ISO 8601 strings are read as `ballast init` and the codec read them
    (a zone or an offset honoured, none as UTC, a date at its midnight), so equal instants
    written in different zones tie; a string that is no date, or a column of numbers, is
    refused naming the holdout column."""
    strings = pa.array(
        [
            "2024-03-01",
            "2024-03-01T00:00:00Z",
            "2024-03-01 01:00:00+01:00",
            "2024-02-29T19:00-05:00",
        ]
    )
    times = row_times(strings, "seen")
    assert len(set(times.tolist())) == 1
    assert times[0] == row_times(pa.array([19_783], pa.date32()), "seen")[0]
    with pytest.raises(TimeColumnError, match=r"holdout column 'seen'.*'soon'"):
        row_times(pa.array(["2024-03-01", "soon"]), "seen")
    with pytest.raises(TimeColumnError, match="holdout column 'seen' is int64"):
        row_times(pa.array([1, 2]), "seen")


def test_a_null_time_rejects_its_file_naming_the_column_and_first_row(tmp_path) -> None:
    """Invariant: a row without a time cannot be placed before or after the cutoff, so
    its file is rejected naming the column, the count and the file's row of the first
    null; a file of strings that are no dates is rejected naming the column."""
    batch = pa.record_batch({"label": [0, 1, 0], "seen": pa.array([1, None, None], pa.date32())})
    reason = row_problem(batch, time_spec(), first_row=10)
    assert reason is not None and "2 null times in column 'seen'" in reason
    assert "the first at row 11 of the file" in reason
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"label": [0, 1], "x": [0.0, 1.0], "seen": ["2024-01-01", "x"]}), path)
    file = InputFile(str(path), str(tmp_path), path.name, path.stat().st_size, "t")
    scan = scan_file(file, time_spec(), 1, 0.2, 100)
    assert scan.reason is not None and "holdout column 'seen'" in scan.reason


def test_a_file_of_many_times_coarsens_its_cells_and_keeps_its_rows() -> None:
    """Invariant: however many distinct times a file holds, its tally keeps at most
    MAX_BUCKETS buckets (coarsening by halves) and every row; a cut of files at different
    levels takes them to the coarsest, and its counts add up to the rows."""
    rng = np.random.default_rng(3)
    tally = TimeTally()
    for batch in range(5):
        times = rng.integers(0, 10**15, size=1_000)
        tally.coarsen_to(tally.level_for(times))
        records = np.zeros(1_000, CELL_DTYPE)
        records["piece"], records["num_rows"] = batch, 1
        records["cell"] = row_cells(times, rng.integers(0, SLICES, size=1_000), tally.level)
        tally.add(records, ["a"], ["r"])
    fine = TimeTally()
    two = np.zeros(2, CELL_DTYPE)
    two["cell"], two["label"], two["num_rows"] = [5 * SLICES + 3, 9 * SLICES], [1, 0], [7, 2]
    fine.add(two, ["a", "b"], ["r"])
    cells = [tally.cells(), fine.cells()]
    assert len(np.unique(cells[0].rows["cell"] // SLICES)) <= MAX_BUCKETS < 5_000
    assert int(cells[0].rows["num_rows"].sum()) == 5_000 and cells[1].level == 0
    cut = choose_cut(cells, 0.25)
    assert cut.level == cells[0].level > 0
    split = [split_counts(part, cut) for part in cells]
    totals = Counter()
    for counts in split:
        for _, side, _, _, n in counts.records():
            totals[side] += n
    assert totals["train"] + totals["holdout"] == 5_009
    assert abs(totals["holdout"] / 5_009 - 0.25) < 0.05
    again = decode_scans(
        encode_scans([FileScan(InputFile("f", "r", "f", 1, "t"), time_cells=cells[0])], "v"), "v"
    )
    assert again[0].time_cells == cells[0]


def test_no_holdout_when_no_cut_can_keep_train_or_none_is_asked() -> None:
    """Invariant: one cell (a single row, or one time and tie) cannot be cut without
    emptying train, and a fraction of 0 holds nothing out: the cut holds no row."""
    one = TimeCells.of(0, {(0, 42, "a", "r"): 5})
    assert choose_cut([one], 0.5).cutoff == NO_HOLDOUT
    two = TimeCells.of(0, {(0, 1, "a", "r"): 5, (0, 2, "a", "r"): 5})
    assert choose_cut([two], 0.0).cutoff == NO_HOLDOUT
    assert choose_cut([two], 0.5).cutoff == 2


def test_time_holdout_settings_default_to_today_and_refuse_what_they_cannot_keep() -> None:
    """Invariant: `holdout_by: random` (the default) and no holdout column leave a
    config's version id as it was (SETTINGS_ADDED_LATER); `newest` without a column, a
    column without `newest`, and `newest` beside a group or duplicates rule are each
    refused in one line naming the fields."""
    dumped = ReshardConfig(dataset=DatasetSpec(inputs=["raw"]), output_root="out").model_dump()
    assert "holdout_by" not in comparable_settings(dumped)["dataset"]
    assert "holdout_column" not in comparable_settings(dumped)["dataset"]
    cases = [
        ({"holdout_by": "newest"}, "needs dataset.holdout_column"),
        ({"holdout_column": "seen"}, "holdout_by is 'random'"),
        ({"holdout_by": "newest", "holdout_column": "label"}, "is the label column"),
        (
            {"holdout_by": "newest", "holdout_column": "seen", "group_column": "user"},
            "cannot be set with group_column or duplicates",
        ),
        (
            {"holdout_by": "newest", "holdout_column": "seen", "duplicates": "same_split"},
            "cannot be set with group_column or duplicates",
        ),
    ]
    for fields, message in cases:
        with pytest.raises(ValueError, match=message):
            DatasetSpec(inputs=["raw"], **fields)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(SECONDS, min_size=1, max_size=400),
    st.lists(st.integers(1, 400), min_size=1, max_size=6),
    st.sampled_from([1, 1_000, 10**6]),  # seconds as us: 2**33 s stays within int64
)
def test_a_files_cells_do_not_depend_on_how_its_rows_are_batched(seconds, sizes, scale) -> None:
    """Invariant: a file's tally (level and records) is the same whatever batches its
    scan reads it in: the level is the finest that holds the whole file within
    MAX_BUCKETS buckets, so a rerun, or a reader with other batch sizes, cuts alike."""
    times = np.array(seconds, dtype=np.int64) * scale
    slices = np.arange(len(times)) % SLICES

    def tally(bounds: list[int]) -> TimeCells:
        counted = TimeTally()
        for start, stop in pairwise(bounds):
            counted.coarsen_to(counted.level_for(times[start:stop]))
            records = np.zeros(stop - start, CELL_DTYPE)
            records["piece"], records["num_rows"] = np.arange(start, stop) // 50, 1
            records["cell"] = row_cells(times[start:stop], slices[start:stop], counted.level)
            counted.add(records, ["a"], ["r"])
        return counted.cells()

    cuts = np.cumsum(sizes)
    batched = tally([0, *[int(c) for c in cuts if c < len(times)], len(times)])
    assert batched == tally([0, len(times)])
    assert len(np.unique(batched.rows["cell"] // SLICES)) <= MAX_BUCKETS
    assert int(batched.rows["num_rows"].sum()) == len(times)
