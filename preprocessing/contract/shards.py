"""Writing one shard of a dataset version, and the Parquet writer settings of every shard.

Every version writer (the reshard's write tasks, batch inference, the token dataset
writer, test fixtures, benchmarks) writes its shards through `ShardWriter` or
`write_shard`, which return the shard's manifest entry (`ShardEntry`: name, rows, bytes,
row groups, sha256, class and source counts), and commits through
`preprocessing/versions/attempt.py: VersionAttempt.commit` (the manifest, then
`_CURRENT`): no writer makes `v-<id>/` by hand. The writer settings are `parquet_options`,
one place for all of them.

A shard's row groups hold `rows_per_row_group` rows each but the last, whatever sizes
its rows come in: readers plan reads from the manifest, without footers. Bytes are a
function of the rows alone, so every attempt of a version writes the same shard.
Part of the contract room: training-side writers (fixtures of tests/training) use it too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from preprocessing.contract.integrity import PAGE_CHECKSUMS
from preprocessing.contract.manifest import ShardEntry, shard_path
from preprocessing.storage.objects import DEFAULT_PART_BYTES, write_object

COMPRESSION = "zstd"


def parquet_options(schema: pa.Schema, dictionary_columns: list[str]) -> dict[str, Any]:
    """The Parquet writer options of every shard of `schema`."""
    # Dictionary-encode only the low-cardinality label and source columns: on float and id
    # columns the dictionary is useless and made writing about 3x slower.
    # Statistics on scalar columns only: min/max over the elements of a list column (an
    # embedding) prune nothing, and skipping them made encoding about 6% faster.
    # Page checksums (contract/integrity.py): flipped bytes in any page are an error
    # naming the shard and row group on read, never wrong rows.
    return {
        **PAGE_CHECKSUMS,
        "compression": COMPRESSION,
        "write_statistics": [f.name for f in schema if not pa.types.is_nested(f.type)],
        "use_dictionary": [name for name in dictionary_columns if name in schema.names],
    }


def stored_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` as a shard stores it (format 3): a fixed-size list column as a list, the
    Arrow form of Delta Lake's array, which has no fixed size (the manifest's schema and
    codec keep it), and a dictionary column as its values (Delta has no dictionary type;
    the Parquet pages are dictionary-encoded all the same), so a shard holds exactly the
    types of the root's Delta table and Polars' own Delta reader, which casts no
    fixed-size list, reads it."""
    return pa.schema([_stored_field(f) for f in schema], metadata=schema.metadata)


def _stored_field(field: pa.Field) -> pa.Field:
    if pa.types.is_fixed_size_list(field.type):
        return field.with_type(pa.list_(field.type.value_field))
    if pa.types.is_dictionary(field.type):
        return field.with_type(field.type.value_type)
    return field


class ShardWriter:
    """`writer = ShardWriter(uri, ...)`, `writer.write(table)` as often as needed (rows in
    order), then `entry = writer.close()`: the shard is encoded in memory and written as one
    object (a multipart upload of `part_bytes` parts on S3 from twice that size)."""

    def __init__(
        self,
        uri: str,
        rows_per_row_group: int,
        label_column: str,
        source_column: str | None = None,
        schema: pa.Schema | None = None,
        part_bytes: int = DEFAULT_PART_BYTES,
        buffer: pa.Buffer | None = None,
    ) -> None:
        self.uri, self.rows_per_row_group = uri, rows_per_row_group
        self.label_column, self.source_column = label_column, source_column
        self.part_bytes = part_bytes
        self.etag: str | None = None  # the store's, once written (S3)
        self._schema = schema
        # An Arrow buffer: no regrowth copies, no copy out; or `buffer` (EncodeBuffer), which
        # an encode larger than it fails with OSError "Write out of bounds".
        self._buffer = buffer
        self._sink: Any = (
            pa.BufferOutputStream() if buffer is None else pa.FixedSizeBufferWriter(buffer)
        )
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._num_rows = self._num_row_groups = 0
        self._counts: dict[str, dict[str, int]] = {"class": {}, "source": {}}

    def write(self, table: pa.Table) -> None:
        """Add `table`'s rows; whole row groups are encoded as soon as they are complete."""
        self._pending.append(table)
        pending = sum(part.num_rows for part in self._pending)
        full = pending - pending % self.rows_per_row_group
        if full:
            joined = self._joined()
            self._encode(joined.slice(0, full))
            self._pending = [joined.slice(full)] if full < pending else []

    def close(self) -> ShardEntry:
        """Encode the last row group, write the shard; its manifest entry."""
        return self.store(self.encoded())

    def encoded(self) -> memoryview:
        """Encode the last row group and the footer; the shard's bytes."""
        if self._pending:
            self._encode(self._joined())
            self._pending = []
        if self._writer is None:
            if self._schema is None:
                raise ValueError(f"{self.uri}: no rows and no schema to write a shard of")
            self._encode(self._schema.empty_table())
        assert self._writer is not None
        self._writer.close()
        if self._buffer is not None:
            return memoryview(self._buffer)[: self._sink.tell()]
        return memoryview(self._sink.getvalue())

    def store(self, payload: memoryview) -> ShardEntry:
        """Write the shard's bytes (`encoded()`); its manifest entry."""
        fs, path = url_to_fs(self.uri)
        self.etag = write_object(fs, path, payload, self.part_bytes)  # S3's, else None
        return ShardEntry(
            path=shard_path(self.uri),
            num_rows=self._num_rows,
            num_bytes=payload.nbytes,
            num_row_groups=self._num_row_groups,
            rows_per_row_group=self.rows_per_row_group,
            sha256=hashlib.sha256(payload).hexdigest(),
            class_counts=self._counts["class"],
            source_counts=self._counts["source"],
        )

    def _joined(self) -> pa.Table:
        # One chunk per row group: the encoder's pages follow the chunks.
        if len(self._pending) == 1:
            return self._pending[0]
        return pa.concat_tables(self._pending).combine_chunks()

    def _encode(self, table: pa.Table) -> None:
        if self._writer is None:
            schema = stored_schema(self._schema or table.schema)
            dictionary = [self.label_column, *([self.source_column] if self.source_column else [])]
            self._writer = pq.ParquetWriter(
                self._sink, schema, **parquet_options(schema, dictionary)
            )
        if table.schema != self._writer.schema:
            table = table.cast(self._writer.schema)
        self._writer.write_table(table, row_group_size=self.rows_per_row_group)
        self._num_rows += table.num_rows
        self._num_row_groups += -(-table.num_rows // self.rows_per_row_group)
        self._count("class", table, self.label_column)
        if self.source_column:
            self._count("source", table, self.source_column)

    def _count(self, kind: str, table: pa.Table, column: str) -> None:
        totals = self._counts[kind]
        for key, count in _value_counts(table.column(column)):
            totals[key] = totals.get(key, 0) + count


def _value_counts(column: pa.ChunkedArray) -> zip[tuple[str, int]]:
    """(str(value), rows) of every value of `column`. An integer column without nulls is
    counted by numpy (a tenth of Arrow's hash count and its list of dicts on a small
    shard); the keys are the same strings either way."""
    if pa.types.is_integer(column.type) and column.null_count == 0:
        values, counts = np.unique(column.to_numpy(), return_counts=True)
        return zip(map(str, values.tolist()), counts.tolist(), strict=True)
    found = pc.value_counts(column)
    return zip(
        map(str, found.field("values").to_pylist()), found.field("counts").to_pylist(), strict=True
    )


class EncodeBuffer:
    """One buffer that a writer of several shards (a worker thread's write tasks, until
    the write stage ends: exchange/tasks.py) encodes each large one into in turn: the
    encoder then writes to pages it touched already, where a growing stream per shard
    faulted in fresh ones for every shard (benchmarks/RESULTS.md M32, M54).
    It grows to the largest shard's bound, never shrinks; small shards, which gain
    nothing, are encoded into their own stream."""

    MIN_TABLE_BYTES = 4 << 20

    def __init__(self) -> None:
        self._buffer: pa.Buffer | None = None

    def for_bytes(self, nbytes: int) -> pa.Buffer | None:
        """A buffer to encode rows of `nbytes` Arrow bytes into (bound: those bytes and a
        sixteenth, plus 1 MiB for headers and footer; rarely too small, see
        `write_shard`), or None."""
        if nbytes < self.MIN_TABLE_BYTES:
            return None
        bound = nbytes + nbytes // 16 + (1 << 20)
        if self._buffer is None or self._buffer.size < bound:
            self._buffer = pa.allocate_buffer(bound)
        return self._buffer


@dataclass(frozen=True)
class ShardSlices:
    """A shard's rows as consecutive slices made on demand (`make()`: a fresh iterator
    each call, so an encode that overflows its buffer can make them again), with their
    schema and about their Arrow bytes. Slices of whole row groups are encoded as they
    come: a writer of a large shard then holds one slice of it, not a second copy."""

    schema: pa.Schema
    nbytes: int
    make: Callable[[], Iterable[pa.Table]]

    @classmethod
    def of(cls, table: pa.Table) -> ShardSlices:
        return cls(table.schema, table.nbytes, lambda: [table])


def write_shard(
    uri: str,
    rows: pa.Table | ShardSlices,
    rows_per_row_group: int,
    label_column: str,
    source_column: str | None = None,
    part_bytes: int = DEFAULT_PART_BYTES,
    encode: EncodeBuffer | None = None,
    etags: dict[str, str] | None = None,
) -> ShardEntry:
    """Write `rows` (a table, or its slices in order) as the shard at `uri`; its manifest
    entry. `encode`: a buffer reused across the caller's shards (same bytes written; a
    shard that does not fit it is encoded again into its own stream). `etags`: where the
    store gave the object an ETag (S3), shard name -> ETag is added to it (what a write
    receipt records)."""
    slices = rows if isinstance(rows, ShardSlices) else ShardSlices.of(rows)
    buffer = encode.for_bytes(slices.nbytes) if encode is not None else None
    writer = ShardWriter(
        uri,
        rows_per_row_group,
        label_column,
        source_column,
        schema=slices.schema,
        part_bytes=part_bytes,
        buffer=buffer,
    )
    try:
        for part in slices.make():
            writer.write(part)
        payload = writer.encoded()
    except OSError:
        if buffer is None:
            raise
        return write_shard(
            uri, slices, rows_per_row_group, label_column, source_column, part_bytes, None, etags
        )
    entry = writer.store(payload)
    if etags is not None and writer.etag:
        etags[entry.path] = writer.etag
    return entry
