"""Staged objects of the exchange: rows grouped by destination, with their index inside.

One object covers destinations [first, first + n) and is laid out as

    header   an Arrow IPC stream header: the schema and one empty record batch
    data     destination first's record batches, then first + 1's, ... (IPC messages)
    EOS      the IPC end-of-stream marker (the object so far is a valid IPC stream)
    index    n + 1 little-endian int64: where each destination's messages start, then
             where the data ends
    trailer  n as a little-endian uint64, then MAGIC

A reader of destinations [lo, hi) reads index entries lo..hi (one ranged read at a
position its descriptor gives), then the bytes from the first to the last (one ranged
read): two requests per reader and object, however many rows or destinations. Local
files are memory-mapped instead of read. A merge copies message bytes from several
objects into one, destination by destination; nothing is decoded. Objects are written
whole: a local file streamed from the batches, or one PUT on an object store (s3fs
turns a body of 100 MiB or more into a multipart upload), so a reader never sees half.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

MAGIC = b"BLSTIDX1"
_INDEX_ITEM = np.dtype("<i8")


@dataclass(frozen=True)
class StagedObject:
    """Where a staged object is, which destinations it covers, and where its index is."""

    uri: str
    first_destination: int
    num_destinations: int
    index_offset: int


class StagedWriter:
    """Writes one staged object; each `add_*` call holds the next destination's rows."""

    def __init__(self, uri: str, schema: pa.Schema, first_destination: int) -> None:
        self.uri, self.first_destination = uri, first_destination
        self._fs, path = url_to_fs(uri)
        self._local_path = path if isinstance(self._fs, LocalFileSystem) else None
        if self._local_path:  # object stores have no directories (and a check is a request)
            self._fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        self._sink = pa.OSFile(path, "wb") if self._local_path else pa.BufferOutputStream()
        self._writer = pa.ipc.new_stream(self._sink, schema)
        # The stream header is written with the first batch: an empty one puts it here.
        self._writer.write_batch(pa.record_batch([pa.array([], f.type) for f in schema],
                                                 schema=schema))
        self._offsets = [self._sink.tell()]

    def add_batches(self, batches: Iterable[pa.RecordBatch]) -> None:
        """The next destination's rows, as record batches (none: no rows)."""
        for batch in batches:
            self._writer.write_batch(batch)
        self._offsets.append(self._sink.tell())

    def add_messages(self, chunks: Iterable[Any]) -> None:
        """The next destination's rows, as IPC messages copied from other staged objects."""
        for chunk in chunks:
            self._sink.write(chunk)
        self._offsets.append(self._sink.tell())

    def close(self) -> StagedObject:
        self._writer.close()  # the end-of-stream marker
        index_offset = self._sink.tell()
        num_destinations = len(self._offsets) - 1
        self._sink.write(np.asarray(self._offsets, dtype=_INDEX_ITEM).tobytes())
        self._sink.write(np.uint64(num_destinations).tobytes() + MAGIC)
        if self._local_path:
            self._sink.close()
        else:
            payload = self._sink.getvalue()
            self._fs.pipe_file(url_to_fs(self.uri)[1], payload.to_pybytes())
        return StagedObject(self.uri, self.first_destination, num_destinations, index_offset)


def read_destinations(staged: StagedObject, first: int, stop: int) -> tuple[Any, np.ndarray]:
    """The message bytes of destinations [first, stop) of `staged`, and where each
    destination starts in them (stop - first + 1 offsets, the last the length)."""
    if not (staged.first_destination <= first <= stop
            <= staged.first_destination + staged.num_destinations):
        raise ValueError(f"{staged.uri}: destinations [{first}, {stop}) are outside "
                         f"[{staged.first_destination}, "
                         f"{staged.first_destination + staged.num_destinations})")
    position = staged.index_offset + _INDEX_ITEM.itemsize * (first - staged.first_destination)
    raw = _read_range(staged.uri, position, position + _INDEX_ITEM.itemsize * (stop - first + 1))
    index = np.frombuffer(raw, dtype=_INDEX_ITEM)
    if (np.diff(index) < 0).any() or index[0] < 0 or index[-1] > staged.index_offset:
        raise ValueError(f"{staged.uri}: corrupt staged index at destination {first}")
    if index[-1] == index[0]:
        return b"", np.zeros(len(index), dtype=np.int64)
    return _read_range(staged.uri, int(index[0]), int(index[-1])), index - index[0]


def read_batches(data: Any, schema: pa.Schema) -> list[pa.RecordBatch]:
    """The record batches of a run of IPC messages (zero-copy views of `data`)."""
    if not len(data):
        return []
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(data))
    return [pa.ipc.read_record_batch(message, schema) for message in reader]


def merge_staged(inputs: Sequence[StagedObject], first: int, stop: int, uri: str,
                 schema: pa.Schema) -> StagedObject:
    """One object for destinations [first, stop) holding those rows of every input."""
    ranges = [read_destinations(staged, first, stop) for staged in inputs]
    views = [(memoryview(data) if len(data) else b"", offsets) for data, offsets in ranges]
    writer = StagedWriter(uri, schema, first)
    for index in range(stop - first):
        writer.add_messages(view[offsets[index]:offsets[index + 1]]
                            for view, offsets in views if offsets[index + 1] > offsets[index])
    return writer.close()


def _read_range(uri: str, start: int, stop: int) -> Any:
    fs, path = url_to_fs(uri)
    if isinstance(fs, LocalFileSystem):  # mapped: no copy, pages come from the cache
        return pa.memory_map(path).read_at(stop - start, start)
    return pa.py_buffer(fs.cat_file(path, start=start, end=stop))
