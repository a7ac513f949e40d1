"""Staged objects: each destination's rows come back from the object's own index, merges
keep every row of every input, and a damaged index is an error naming the object."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.exchange.staged_objects import (
    StagedObject,
    StagedWriter,
    merge_staged,
    read_batches,
    read_destinations,
)

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()),
                    ("features", pa.list_(pa.float32(), 2))])


def rows_of(ids: list[int]) -> pa.RecordBatch:
    values = np.repeat(np.array(ids, dtype=np.float32), 2)
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array([f"r{i}" for i in ids]),
                            pa.FixedSizeListArray.from_arrays(pa.array(values), 2)],
                           schema=SCHEMA)


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
    stream = Path(merged.uri).read_bytes()[16 + 8 * (stop - first + 1):]
    whole = pa.ipc.open_stream(stream).read_all()
    assert sorted(whole.column("id").to_pylist()) == sorted(
        i for by_destination in layout for ids in by_destination[first:] for i in ids)


def test_reads_outside_an_object_or_through_a_damaged_index_fail(tmp_path: Path) -> None:
    """Invariants: asking for destinations an object does not cover, or reading an index
    whose offsets run backwards, raises an error that names the object; a writer given
    fewer destinations than its object covers refuses to finish it."""
    uri = str(tmp_path / "one.arrow")
    staged = write_object(uri, [[1, 2], [3], []])
    with pytest.raises(ValueError, match="outside"):
        read_destinations(staged, 2, 4)
    raw = bytearray(Path(uri).read_bytes())
    raw[16 + 8: 16 + 16] = np.int64(10**9).tobytes()  # destination 1 starts after 2
    Path(uri).write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"one\.arrow: corrupt staged index"):
        read_destinations(staged, 0, 2)
    short = StagedWriter(StagedObject(str(tmp_path / "short.arrow"), 0, 3), SCHEMA)
    short.add_batches([rows_of([1])])
    with pytest.raises(ValueError, match="1 destinations written, 3 expected"):
        short.close()
