"""Staged objects: each destination's rows come back from the object's own index (per
destination or all of a range in one pass), merges keep every row of every input, and a
damaged index or a file cut short is an error naming the object, never a crash."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.exchange.staged_objects import (
    StagedObject,
    StagedObjectError,
    StagedWriter,
    destination_batches,
    merge_staged,
    read_batches,
    read_destinations,
)
from preprocessing.exchange.staged_rows import ORDER_COLUMN, run_bounds, write_grouped

SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("features", pa.list_(pa.float32(), 2))]
)


def rows_of(ids: list[int]) -> pa.RecordBatch:
    values = np.repeat(np.array(ids, dtype=np.float32), 2)
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"r{i}" for i in ids]),
            pa.FixedSizeListArray.from_arrays(pa.array(values), 2),
        ],
        schema=SCHEMA,
    )


def write_object(uri: str, by_destination: list[list[int]]) -> StagedObject:
    staged = StagedObject(uri, 0, len(by_destination))
    writer = StagedWriter(staged, SCHEMA)
    for ids in by_destination:
        writer.add_batches([rows_of(ids)] if ids else [])
    writer.close()
    return staged


def ids_at(staged: StagedObject, first: int, stop: int) -> list[int]:
    data, _ = read_destinations(staged, first, stop)
    return [i for batch in read_batches(data, SCHEMA) for i in batch.column("id").to_pylist()]


@st.composite
def objects_by_destination(draw: st.DrawFn) -> list[list[list[int]]]:
    """1-4 objects over the same 1-9 destinations, each holding 0-5 ids per destination."""
    num_destinations = draw(st.integers(1, 9))
    ids = st.lists(st.integers(0, 10_000), max_size=5)
    one = st.lists(ids, min_size=num_destinations, max_size=num_destinations)
    return draw(st.lists(one, min_size=1, max_size=4))


@settings(max_examples=40, deadline=None)
@given(layout=objects_by_destination())
def test_destinations_read_back_and_merge_whole(tmp_path_factory, layout) -> None:
    """Invariants: every destination's ids read back from every object, in order; a merge
    of all objects over any block holds, per destination, every object's rows in input
    order; the merged object is a readable Arrow IPC stream of all of them."""
    directory = tmp_path_factory.mktemp("staged")
    objects = [write_object(f"{directory}/in-{i}.arrow", o) for i, o in enumerate(layout)]
    num_destinations = len(layout[0])
    for staged, by_destination in zip(objects, layout, strict=True):
        for destination, ids in enumerate(by_destination):
            assert ids_at(staged, destination, destination + 1) == ids
    first, stop = num_destinations // 3, num_destinations
    merged = StagedObject(f"{directory}/merged.arrow", first, stop - first)
    size = merge_staged(objects, merged, SCHEMA)
    assert size == Path(merged.uri).stat().st_size
    for destination in range(first, stop):
        expected = [i for by_destination in layout for i in by_destination[destination]]
        assert ids_at(merged, destination, destination + 1) == expected
    stream = Path(merged.uri).read_bytes()[16 + 8 * (stop - first + 1) :]
    whole = pa.ipc.open_stream(stream).read_all()
    assert sorted(whole.column("id").to_pylist()) == sorted(
        i for by_destination in layout for ids in by_destination[first:] for i in ids
    )


def test_reads_outside_an_object_or_through_a_damaged_index_fail(tmp_path: Path) -> None:
    """Invariants: asking for destinations an object does not cover, or reading an index
    whose offsets run backwards, raises an error that names the object; a writer given
    fewer destinations than its object covers refuses to finish it."""
    uri = str(tmp_path / "one.arrow")
    staged = write_object(uri, [[1, 2], [3], []])
    with pytest.raises(ValueError, match="outside"):
        read_destinations(staged, 2, 4)
    raw = bytearray(Path(uri).read_bytes())
    raw[16 + 8 : 16 + 16] = np.int64(10**9).tobytes()  # destination 1 starts after 2
    Path(uri).write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"one\.arrow: corrupt staged index"):
        read_destinations(staged, 0, 2)
    short = StagedWriter(StagedObject(str(tmp_path / "short.arrow"), 0, 3), SCHEMA)
    short.add_batches([rows_of([1])])
    with pytest.raises(ValueError, match="1 destinations written, 3 expected"):
        short.close()


@settings(max_examples=30, deadline=None)
@given(layout=objects_by_destination())
def test_one_pass_over_a_range_gives_each_destinations_batches(tmp_path_factory, layout) -> None:
    """Invariant: decoding a range of destinations in one pass (`destination_batches`, what
    write tasks do) yields, per destination, exactly the batches `read_batches` yields for
    that destination alone, for every sub-range."""
    directory = tmp_path_factory.mktemp("one-pass")
    staged = write_object(f"{directory}/in.arrow", layout[0])
    count = len(layout[0])
    for first, stop in [(0, count), (count // 2, count), (0, (count + 1) // 2)]:
        data, offsets = read_destinations(staged, first, stop)
        decoded = destination_batches(data, offsets, SCHEMA)
        assert len(decoded) == stop - first
        for index, batches in enumerate(decoded):
            alone = read_batches(data[offsets[index] : offsets[index + 1]], SCHEMA)
            assert [b.column("id").to_pylist() for b in batches] == [
                b.column("id").to_pylist() for b in alone
            ]
            assert [i for b in batches for i in b.column("id").to_pylist()] == layout[0][
                first + index
            ]


def test_an_index_bound_inside_a_message_is_refused(tmp_path: Path) -> None:
    """Invariant: offsets that cut a message (a damaged index) are a StagedObjectError
    from the one-pass reader, not batches split wrongly."""
    staged = write_object(str(tmp_path / "one.arrow"), [[1, 2], [3]])
    data, offsets = read_destinations(staged, 0, 2)
    damaged = offsets.copy()
    damaged[1] += 8
    with pytest.raises(StagedObjectError, match="inside a message"):
        destination_batches(data, damaged, SCHEMA)


def test_a_staged_file_cut_short_is_an_error_never_a_crash(tmp_path: Path) -> None:
    """Invariant: a local staged object cut short at any byte (a full disk, a killed
    writer, a file truncated behind the run) is a StagedObjectError naming it when the
    destinations asked for reach past the cut (the size is checked against the index
    before any mapped page is touched, so no SIGBUS), and reads back whole when they end
    before it; nothing else."""
    whole = write_object(str(tmp_path / "whole.arrow"), [[1, 2], [], [3, 4, 5], [6]])
    data = Path(whole.uri).read_bytes()
    expected = [[1, 2], [], [3, 4, 5], [6]]
    cut = StagedObject(str(tmp_path / "cut.arrow"), 0, 4)
    outcomes = set()
    for length in range(len(data)):
        Path(cut.uri).write_bytes(data[:length])
        try:
            raw, offsets = read_destinations(cut, 0, 4)
            decoded = destination_batches(raw, offsets, SCHEMA, cut.uri)
        except StagedObjectError as error:
            assert "cut.arrow" in str(error)
            outcomes.add("error")
            continue
        assert [
            [i for b in batches for i in b.column("id").to_pylist()] for batches in decoded
        ] == expected
        outcomes.add("whole")  # only the end-of-stream marker was cut
    assert outcomes == {"error", "whole"}


@given(
    targets=st.lists(st.integers(0, 5), max_size=40),
    run_rows=st.integers(1, 12),
)
@settings(max_examples=60, deadline=None)
def test_rows_staged_in_runs_come_back_per_destination(
    tmp_path_factory, targets: list[int], run_rows: int
) -> None:
    """Invariant: whatever the run length (whole destinations, or parts of a larger one),
    each destination of a map task's staged object holds exactly its rows, in destination
    order, with their order keys; no run is longer than asked."""
    ids = np.arange(len(targets), dtype=np.int64)[::-1]  # rows read in another order
    rows = pa.Table.from_batches([rows_of(ids.tolist())])
    by_target = np.argsort(np.array(targets, dtype=np.int64), kind="stable")
    picks, grouped = by_target, np.array(targets, dtype=np.int64)[by_target]
    keys = (ids[picks] * 7 + 3).astype(np.uint64)
    schema = SCHEMA.append(pa.field(ORDER_COLUMN, pa.uint64()))
    staged = StagedObject(str(tmp_path_factory.mktemp("runs") / "part.arrow"), 0, 6)
    bounds = np.r_[0, np.cumsum(np.bincount(grouped, minlength=6))]
    assert all(0 < end - start <= run_rows for start, end in run_bounds(bounds, run_rows))
    write_grouped_runs(rows, picks, keys, grouped, staged, schema, run_rows)
    data, offsets = read_destinations(staged, 0, 6)
    for destination, batches in enumerate(destination_batches(data, offsets, schema)):
        found = [i for batch in batches for i in batch.column("id").to_pylist()]
        assert found == ids[picks[grouped == destination]].tolist()
        got_keys = [k for batch in batches for k in batch.column(ORDER_COLUMN).to_pylist()]
        assert got_keys == [i * 7 + 3 for i in found]


def write_grouped_runs(rows, picks, keys, targets, staged, schema, run_rows) -> None:
    """`write_grouped` with runs of `run_rows` rows (its `run_bytes` set to match)."""
    run_bytes = int(run_rows * rows.nbytes / max(1, rows.num_rows)) + 1
    write_grouped(rows, picks, keys, targets, staged, schema, run_bytes)
