"""Staged objects of the exchange: rows grouped by destination, with their index inside.

One object covers destinations [first, first + n) and is laid out as

    header   MAGIC, then n as a little-endian uint64
    index    n + 1 little-endian int64: where each destination's messages start in the
             object, then where they end
    stream   an Arrow IPC stream: the schema, one empty record batch, destination first's
             record batches, then first + 1's, ..., and the end-of-stream marker

The index sits at a fixed place, so a reader of destinations [lo, hi) needs only the
object's name and first destination, both of which follow from the exchange's layout:
it reads index entries lo..hi (one ranged read), then the bytes from the first to the
last (one ranged read), two requests per reader and object however many rows or
destinations there are, and the driver keeps nothing per object. Local files are
memory-mapped instead of read (one size check against the index first, so a file cut
short is a StagedObjectError, never a SIGBUS; each range populated as it is mapped), and a
write task decodes each object's range once for all its shards (`destination_batches`).
A merge copies message bytes from several objects into
one, destination by destination; nothing is decoded. Objects are written whole: a local
file streamed from the batches (the index filled in last), or on an object store one PUT
or, from twice the object's `part_bytes`, a multipart upload (`storage.write_object`), so
a reader never sees half an object once its task has returned.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from preprocessing.exchange.receipts import (
    object_receipt,
    range_crcs,
    read_object_receipt,
    write_object_receipt,
)
from preprocessing.storage.objects import DEFAULT_PART_BYTES, write_object

MAGIC = b"BLSTIDX2"
_INDEX_ITEM = np.dtype("<i8")
_HEADER_BYTES = len(MAGIC) + 8
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only; elsewhere pages fault in as read
WRITE_BUFFER_BYTES = 1 << 20


class StagedObjectError(ValueError):
    """A staged object whose bytes are not what its writer wrote (cut short or damaged)."""


@dataclass(frozen=True)
class StagedObject:
    """Where a staged object is, which destinations it covers, and the part size of its
    multipart upload to an object store."""

    uri: str
    first_destination: int
    num_destinations: int
    part_bytes: int = DEFAULT_PART_BYTES
    receipt: bool = False  # mark it written once it is, for a rerun (exchange/receipts.py)


class StagedWriter:
    """Writes one staged object; each `add_*` call holds the next destination's rows."""

    def __init__(self, staged: StagedObject, schema: pa.Schema) -> None:
        self.staged = staged
        self._fs, self._path = url_to_fs(staged.uri)
        index_bytes = _HEADER_BYTES + _INDEX_ITEM.itemsize * (staged.num_destinations + 1)
        self._local = isinstance(self._fs, LocalFileSystem)
        if self._local:
            self._fs.makedirs(self._path.rsplit("/", 1)[0], exist_ok=True)
            # Arrow's own buffered file: a destination's batch is about a dozen small
            # writes, which through a Python file cost 3.5x as much (RESULTS.md M36).
            self._sink: Any = pa.BufferedOutputStream(
                pa.OSFile(self._path, "wb"), buffer_size=WRITE_BUFFER_BYTES
            )
        else:  # object stores have no directories (and a check is a request)
            self._sink = pa.BufferOutputStream()
        self._sink.write(bytes(index_bytes))  # filled in by close()
        self._writer = pa.ipc.new_stream(self._sink, schema)
        # The stream header is written with the first batch: an empty one puts it here.
        self._writer.write_batch(
            pa.record_batch([pa.array([], f.type) for f in schema], schema=schema)
        )
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

    def close(self) -> int:
        """Finish the object (and its receipt, if it wants one); its size in bytes."""
        if len(self._offsets) != self.staged.num_destinations + 1:
            if self._local:
                self._sink.close()
            raise ValueError(
                f"{self.staged.uri}: {len(self._offsets) - 1} destinations "
                f"written, {self.staged.num_destinations} expected"
            )
        self._writer.close()  # the end-of-stream marker
        size = int(self._sink.tell())
        header = MAGIC + np.uint64(self.staged.num_destinations).tobytes()
        index = header + np.asarray(self._offsets, dtype=_INDEX_ITEM).tobytes()
        finish = self._finish_local if self._local else self._finish_remote
        receipt = finish(index)
        if self.staged.receipt and receipt is not None:
            content, check = receipt
            write_object_receipt(self._fs, self._path, size, check, content)
        return size

    def _finish_local(self, index: bytes) -> tuple[bytes, str] | None:
        """Fill in the index; if a receipt needs it, its content and check: each
        destination's CRC-32, read back from the page cache."""
        self._sink.close()
        with open(self._path, "r+b") as handle:
            os.pwrite(handle.fileno(), index, 0)
            if not self.staged.receipt:
                return None
            crcs = range_crcs(partial(_pread, handle.fileno()), self._offsets)
        return object_receipt(self._offsets, crcs)

    def _finish_remote(self, index: bytes) -> tuple[bytes, str]:
        """One PUT (or multipart upload) of the whole object; the ETag the store gave it,
        which its listing shows (a receipt's check, exchange/receipts.py), else (a store
        without ETags) a receipt of each destination's CRC-32."""
        body = self._sink.getvalue()
        whole = b"".join([index, memoryview(body)[len(index) :]])
        tag = write_object(self._fs, self._path, whole, self.staged.part_bytes)
        if tag:
            return b"", tag
        view = memoryview(whole)
        crcs = range_crcs(lambda start, stop: view[start:stop], self._offsets)
        return object_receipt(self._offsets, crcs)


def read_destinations(staged: StagedObject, first: int, stop: int) -> tuple[Any, np.ndarray]:
    """The message bytes of destinations [first, stop) of `staged`, and where each
    destination starts in them (stop - first + 1 offsets, the last the length)."""
    if not (
        staged.first_destination
        <= first
        <= stop
        <= staged.first_destination + staged.num_destinations
    ):
        raise ValueError(
            f"{staged.uri}: destinations [{first}, {stop}) are outside "
            f"[{staged.first_destination}, "
            f"{staged.first_destination + staged.num_destinations})"
        )
    read = _range_reader(staged.uri)
    position = _HEADER_BYTES + _INDEX_ITEM.itemsize * (first - staged.first_destination)
    raw = read(position, position + _INDEX_ITEM.itemsize * (stop - first + 1))
    index = np.frombuffer(raw, dtype=_INDEX_ITEM)
    if len(index) != stop - first + 1 or (np.diff(index) < 0).any() or index[0] < position:
        raise StagedObjectError(f"{staged.uri}: corrupt staged index at destination {first}")
    if index[-1] == index[0]:
        return b"", np.zeros(len(index), dtype=np.int64)
    return read(int(index[0]), int(index[-1])), index - index[0]


def ranges_intact(uri: str, num_bytes: int, check: str, wanted: Sequence[int] | None) -> bool:
    """Whether the destinations `wanted` (counted from the object's first; None: all) of
    the staged object at `uri` hold what its CRC-32 receipt (`num_bytes`, `check`) says:
    its index as the receipt has it, and each wanted range's CRC-32. Only those ranges
    are read, the only bytes a reader of those destinations touches (False if unreadable)."""
    fs, path = url_to_fs(uri)
    receipt = read_object_receipt(fs, path, num_bytes, check)
    if receipt is None:
        return False
    offsets, crcs = receipt
    count = len(crcs)
    picked = range(count) if wanted is None else wanted
    if not all(0 <= d < count for d in picked):  # a receipt of fewer destinations
        return False
    try:
        read = _range_reader(uri)
        header = bytes(read(0, _HEADER_BYTES + _INDEX_ITEM.itemsize * (count + 1)))
        if header != MAGIC + np.uint64(count).tobytes() + offsets.tobytes():
            return False
        found = [range_crcs(read, offsets[d : d + 2].tolist())[0] for d in picked]
    except (OSError, ValueError):  # StagedObjectError among them: cut short
        return False
    return found == [int(crcs[d]) for d in picked]


def _pread(descriptor: int, start: int, stop: int) -> bytes:
    return os.pread(descriptor, stop - start, start)


def read_batches(
    data: Any, schema: pa.Schema, origin: str = "a staged object"
) -> list[pa.RecordBatch]:
    """The record batches of a run of IPC messages (zero-copy views of `data`), each
    checked for buffers that fit its lengths (not its values: a flipped byte in a value
    is not seen) so damaged bytes are a StagedObjectError, never a crash later."""
    if not len(data):
        return []
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(data))
        batches = [pa.ipc.read_record_batch(message, schema) for message in reader]
        for batch in batches:
            batch.validate()
    except (pa.ArrowException, OSError, ValueError) as error:
        raise StagedObjectError(f"{origin}: staged messages do not decode ({error})") from None
    return batches


def destination_batches(
    data: Any, offsets: np.ndarray, schema: pa.Schema, origin: str = "a staged object"
) -> list[list[pa.RecordBatch]]:
    """`read_batches` of each destination of a range `read_destinations` returned, decoded
    in one pass over the range (one reader, not one per destination), with the same
    checks: every destination's bounds fall between messages."""
    found: list[list[pa.RecordBatch]] = [[] for _ in range(len(offsets) - 1)]
    if not len(data):
        return found
    source, starts = pa.BufferReader(data), []
    try:
        while (position := source.tell()) < len(data):
            starts.append(position)
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(source), schema)
            batch.validate()
            found[int(np.searchsorted(offsets, position, side="right")) - 1].append(batch)
    except (pa.ArrowException, OSError, ValueError, EOFError) as error:  # EOF: an end mark
        raise StagedObjectError(f"{origin}: staged messages do not decode ({error})") from None
    if not np.isin(offsets, [*starts, len(data)]).all():
        raise StagedObjectError(f"{origin}: a destination's bounds fall inside a message")
    return found


def merge_staged(inputs: Sequence[StagedObject], output: StagedObject, schema: pa.Schema) -> int:
    """Write `output` with, for each of its destinations, those rows of every input (in
    input order); its size in bytes."""
    first, stop = output.first_destination, output.first_destination + output.num_destinations
    ranges = [read_destinations(staged, first, stop) for staged in inputs]
    views = [(memoryview(data) if len(data) else b"", offsets) for data, offsets in ranges]
    writer = StagedWriter(output, schema)
    for index in range(stop - first):
        writer.add_messages(
            view[offsets[index] : offsets[index + 1]]
            for view, offsets in views
            if offsets[index + 1] > offsets[index]
        )
    return writer.close()


def _range_reader(uri: str) -> Callable[[int, int], Any]:
    """`read(start, stop)`: bytes [start, stop) of the object, StagedObjectError when it
    holds fewer (an index pointing past its end: the object was cut short or its index
    damaged). A local file's size is read once and every range checked against it before
    any byte is touched, so a file cut short is that error, never a SIGBUS; a range is
    memory-mapped (no copy, pages from the cache) and populated in the one call that maps
    it, instead of a page fault per page touched later (`_mapped`)."""
    fs, path = url_to_fs(uri)
    if isinstance(fs, LocalFileSystem):
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size

        def read_mapped(start: int, stop: int) -> Any:
            if stop > size:
                raise StagedObjectError(
                    f"{uri}: bytes [{start}, {stop}) asked for, the staged "
                    f"object holds {size}: cut short or damaged"
                )
            return _mapped(path, start, stop)

        return read_mapped

    def read_remote(start: int, stop: int) -> Any:
        data = pa.py_buffer(fs.cat_file(path, start=start, end=stop))
        if len(data) != stop - start:
            raise StagedObjectError(
                f"{uri}: bytes [{start}, {stop}) asked for, {len(data)} "
                f"read: the staged object was cut short or its index damaged"
            )
        return data

    return read_remote


def _mapped(path: str, start: int, stop: int) -> pa.Buffer:
    """Bytes [start, stop) of a local file, mapped read-only with MAP_POPULATE (Linux):
    the kernel fills the page table from the page cache in the mapping call, where touching
    a fresh mapping faulted about once per 4-64 KiB (benchmarks/RESULTS.md M32). The
    mapping lives as long as the buffer."""
    if stop == start:
        return pa.py_buffer(b"")
    offset = start - start % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as handle:
        mapped = mmap.mmap(
            handle.fileno(),
            stop - offset,
            flags=mmap.MAP_SHARED | _POPULATE,
            prot=mmap.PROT_READ,
            offset=offset,
        )
    return pa.py_buffer(mapped).slice(start - offset)
