"""Plan a split's row groups from its manifest, and read and decode one row group.

The one place that touches shard files for training. Start-up reads the
manifest only: every row group's size comes from `ShardEntry.row_group_sizes()`
and the feature width from the manifest's Arrow schema, so a version of 1e5
shards opens without one footer read. A shard is opened when one of its row
groups is first needed, through fsspec: pyarrow reads the footer and then the
row group's column chunks as coalesced byte ranges (`pre_buffer`), over a
file opened with `cache_type="none"`, since any read-ahead cache of fsspec's
would only fetch bytes nobody asked for. Local files (and shards in the disk
cache, training/data/cache.py) are read by pyarrow's own file, which releases the GIL.
Row groups of one shard that the read-ahead takes in together are read by one call
(`read_row_groups`): Arrow sets up a reader per column at each call, 35-50 CPU-ms on
5,000 columns, whatever the rows.
Columns are picked by their leaf index in the file, worked out once per schema (every
shard of a version has the same): `pq.ParquetFile` would map every column's path again
at each open, 9,000 Python objects a row group on 5,000 columns, and objects kept that
long make the garbage collector's full passes come more often (one costs 0.1 CPU-s there).

Checks, and when they run (preprocessing/contract/integrity.py): before a shard's
bytes are decoded, its size must equal the manifest's (`read.verify: size`, the
default) or its whole content hash to the manifest's sha256 (`sha256`: once per
shard and process, a full read; `none`: neither); a mismatch raises ShardDamaged
naming the version, the shard and both sizes or digests. The footer's row count,
row-group count and the row group's own size must equal the manifest's at every read
(ManifestError naming the shard). Page checksums are verified on every read, so a page
whose bytes changed is a ShardDamaged naming the shard and the row group. The sha256 of
a whole shard is also checked when it enters the disk cache (training/data/cache.py).

A read that fails for a reason that may pass (an S3 503 or reset, a body cut short) is
tried again under the reshard's retry policy (preprocessing/toolbox/faults.py,
`ReadConfig.retry`): one throttled request costs seconds, not a restart of every rank
from the last checkpoint. A disagreement with the manifest is never retried.

Features are encoded by the dataset's feature codec (preprocessing/contract/codec.py, its
state read from the manifest), the one evaluation and batch inference use too: a lone
`fixed_size_list<float32>` column becomes an [n, D] matrix without a copy. Labels become
class indices in the order of `manifest.classes`.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from preprocessing.contract.codec import FeatureCodec, FeatureError, label_indices
from preprocessing.contract.integrity import (
    VERIFY_PAGES,
    ShardDamaged,
    ShardRef,
    check_sha256,
    check_size,
    handle_size,
    page_damage,
    shard_version,
)
from preprocessing.contract.manifest import (
    Manifest,
    ManifestError,
    ShardEntry,
    read_manifest,
    shard_uri,
)
from preprocessing.toolbox.faults import RetryPolicy, call_with_retries
from training.data.cache import ShardCache

FOOTERS_KEPT = 256


class ShardMissingError(FileNotFoundError, ManifestError):
    """A shard listed in the manifest cannot be opened."""


@dataclass(frozen=True)
class Columns:
    """The columns a batch is built from, named by the manifest."""

    label: str
    id: str
    codec: FeatureCodec
    classes: tuple[Any, ...]

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> Columns:
        codec = FeatureCodec.from_manifest(manifest)
        return cls(manifest.label_column, manifest.id_column, codec, tuple(manifest.classes))

    @cached_property
    def names(self) -> list[str]:
        return list(dict.fromkeys([self.id, self.label, *self.codec.names]))


@dataclass(frozen=True)
class Layout:
    """Where every row group of a split lives, and how many rows it holds."""

    shard_uris: tuple[str, ...]
    entries: tuple[ShardEntry, ...]
    group_shard: np.ndarray  # shard number of each row group
    group_index: np.ndarray  # row-group index inside its shard
    group_rows: np.ndarray  # rows of each row group
    num_features: int

    @property
    def num_rows(self) -> int:
        return int(self.group_rows.sum())


@dataclass(frozen=True)
class Rows:
    """Decoded rows of one row group (or of one batch) as numpy arrays."""

    features: np.ndarray  # float32 [n, D]
    label: np.ndarray  # int64 class index [n]
    id: np.ndarray  # int64 [n]


def open_split(dataset: str, split: str) -> tuple[Columns, Layout, list[Any]]:
    """The columns, layout and classes of `split` of the version at `dataset`, from its
    manifest alone. Its JSON is read with the garbage collector paused: the parse makes
    an object per feature column (20,000 on 5,000 columns), which would otherwise live
    through young collections into the oldest generation, and a full collection is due
    whenever that grows by a quarter (0.1 CPU-s each with torch loaded). Left alone they
    are freed as the manifest is, never counted there."""
    with collection_paused():
        manifest, location = read_manifest(dataset)
        columns = Columns.from_manifest(manifest)
        return columns, read_layout(manifest, location, split, columns), list(manifest.classes)


@contextmanager
def collection_paused() -> Iterator[None]:
    """The garbage collector off (if it was on) inside the block."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_layout(manifest: Manifest, location: str, split: str, columns: Columns) -> Layout:
    """Every row group of a split, in shard order, from the manifest alone (no footer read)."""
    entries = tuple(manifest.split(split).shards)
    sizes = [group_sizes(entry, location) for entry in entries]
    counts = np.fromiter((len(s) for s in sizes), np.int64, len(sizes))
    rows = np.fromiter((n for s in sizes for n in s), np.int64, int(counts.sum()))
    shard = np.repeat(np.arange(len(entries), dtype=np.int64), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    index = np.arange(len(rows), dtype=np.int64) - first
    uris = tuple(shard_uri(location, entry) for entry in entries)
    return Layout(uris, entries, shard, index, rows, columns.codec.width)


def group_sizes(entry: ShardEntry, location: str) -> list[int]:
    """The entry's row-group sizes, refused when they contradict its own counts."""
    if entry.rows_per_row_group <= 0:
        raise ManifestError(f"{location}: shard {entry.path} has rows_per_row_group <= 0")
    sizes = entry.row_group_sizes()
    if len(sizes) != entry.num_row_groups:
        raise ManifestError(
            f"{location}: shard {entry.path} lists {entry.num_row_groups} row groups, but "
            f"{entry.num_rows} rows at {entry.rows_per_row_group} per group make {len(sizes)}"
        )
    return sizes


class ShardFiles:
    """Opens shards for reading: direct range reads through fsspec, or a verified local copy
    from the disk cache when there is one. Keeps the last FOOTERS_KEPT footers parsed, so
    reading another row group of a shard costs no footer read (one request less on S3)."""

    def __init__(
        self,
        layout: Layout,
        cache: ShardCache | None = None,
        retry: RetryPolicy | None = None,
        verify: str = "size",
    ) -> None:
        self.layout, self.cache, self.retry = layout, cache, retry or RetryPolicy()
        self.verify = verify
        self._footers: dict[int, pq.FileMetaData] = {}
        self._hashed: set[int] = set()  # shards whose sha256 this process checked
        self._parsing: dict[int, threading.Lock] = {}
        self._leaves: tuple[Any, list[str], list[int]] | None = None

    def leaves(self, reader: pq.ParquetReader, names: list[str]) -> list[int]:
        """The Parquet leaf columns of `names` (in their order) in a shard with this footer,
        kept for the last schema seen: every shard of a version has the same, and mapping
        5,000 columns costs 9,000 Python objects (pq.ParquetFile does it at every open)."""
        last = self._leaves
        schema = reader.metadata.schema
        if last is None or last[1] is not names or not last[0].equals(schema):
            last = self._leaves = (schema, names, leaf_indices(reader, names))
        return last[2]

    def ref(self, shard: int) -> ShardRef:
        uri = self.layout.shard_uris[shard]
        return ShardRef(uri, self.layout.entries[shard], shard_version(uri))

    def footer(self, shard: int) -> pq.FileMetaData | None:
        return self._footers.get(shard)

    def parsing(self, shard: int) -> threading.Lock:
        """Held while a shard's footer is parsed: read-ahead threads starting on one shard
        parse it once (a footer of 5,000 columns costs 30-60 ms)."""
        return self._parsing.setdefault(shard, threading.Lock())

    def keep_footer(self, shard: int, metadata: pq.FileMetaData) -> None:
        self._footers[shard] = metadata
        if len(self._footers) > FOOTERS_KEPT:  # oldest first; threads may race to drop it
            self._footers.pop(next(iter(self._footers)), None)

    @contextmanager
    def open(self, shard: int) -> Iterator[Any]:
        uri, entry = self.layout.shard_uris[shard], self.layout.entries[shard]
        try:
            handle = self.cache.open(uri, entry) if self.cache else open_range_reader(uri)
        except FileNotFoundError as error:
            raise ShardMissingError(
                f"shard {entry.path} is listed in the manifest but missing: {uri}"
            ) from error
        with handle:
            self.check(shard, handle)
            yield handle

    def check(self, shard: int, handle: Any) -> None:
        """The `verify` check of an open shard, before any of its bytes are decoded."""
        if self.verify == "size":
            check_size(self.ref(shard), handle_size(handle))
        elif self.verify == "sha256" and shard not in self._hashed:
            check_size(self.ref(shard), handle_size(handle))
            check_sha256(self.ref(shard), handle)
            self._hashed.add(shard)


def open_range_reader(uri: str) -> Any:
    """A file for pyarrow's range reads: its own OS file locally, else an fsspec file."""
    fs, path = url_to_fs(uri)
    if isinstance(fs, LocalFileSystem):
        return pa.OSFile(path)
    return fs.open(path, "rb", cache_type="none")


def read_row_group(layout: Layout, group: int, columns: Columns, files: ShardFiles) -> Rows:
    """Read and decode row group `group` of the layout, checking its footer on the way."""
    return read_row_groups(layout, [group], columns, files)[0]


def read_row_groups(
    layout: Layout, groups: list[int], columns: Columns, files: ShardFiles
) -> list[Rows]:
    """Read row groups `groups` of one shard by one call, and decode each. A call sets up
    Arrow's reader of every column before any rows: 35-50 CPU-ms on 5,000 columns, paid
    once for the lot. When the call finds damaged bytes, the groups are read one by one,
    so that the error names the row group as a read of one does."""
    try:
        table = call_with_retries(
            read_group_table, layout, groups, columns, files, policy=files.retry
        )
    except ShardDamaged:
        if len(groups) == 1:
            raise
        return [read_row_group(layout, group, columns, files) for group in groups]
    parts = group_tables(table, layout.group_rows[groups])
    return [decode_group(layout, *part, columns) for part in zip(groups, parts, strict=True)]


def group_tables(table: pa.Table, rows: np.ndarray) -> list[pa.Table]:
    """The table of a read of several row groups cut back into them (`rows[i]` rows each,
    in the order read), as zero-copy slices."""
    starts = np.cumsum(rows) - rows
    return [table.slice(int(start), int(size)) for start, size in zip(starts, rows, strict=True)]


def decode_group(layout: Layout, group: int, table: pa.Table, columns: Columns) -> Rows:
    try:
        return decode_rows(table, columns)
    except FeatureError as error:  # the shard disagrees with the manifest's codec
        raise ManifestError(
            f"shard {layout.entries[int(layout.group_shard[group])].path}: {error}"
        ) from error


def read_group_table(
    layout: Layout, groups: list[int], columns: Columns, files: ShardFiles
) -> pa.Table:
    """One try at row groups `groups` (of one shard, in this order), the footer checked
    against the manifest."""
    shard = int(layout.group_shard[groups[0]])
    indices = [int(index) for index in layout.group_index[groups]]
    with files.open(shard) as handle:
        try:
            with files.parsing(shard):
                reader = open_reader(handle, files.footer(shard))
                for group in groups:
                    check_footer(reader.metadata, layout, group)
                files.keep_footer(shard, reader.metadata)
            leaves = files.leaves(reader, columns.names)
            # One group: use_threads=False, since reads already run in read-ahead threads
            # and handing each column to Arrow's own pool as well cost 7-10% more CPU per
            # row group here. Several: one call in place of several threads, so Arrow's
            # pool keeps the cores busy (its CPU cost is the same there).
            return reader.read_row_groups(
                indices, column_indices=leaves, use_threads=len(indices) > 1
            )
        except (OSError, pa.ArrowException, ManifestError) as error:
            # Damaged bytes (a page checksum, a header or footer that does not decode) are
            # permanent, not a blip: ShardDamaged, never retried.
            damage = page_damage(files.ref(shard), indices[0], error, files.verify != "none")
            if damage is None:
                raise
            raise damage from error


def open_reader(handle: Any, footer: pq.FileMetaData | None) -> pq.ParquetReader:
    """pyarrow's reader of an open shard, opened as `pq.ParquetFile` opens it (footer given
    or parsed, coalesced range reads, page checksums verified), without the map of every
    column's nested paths that ParquetFile builds at each open (`ShardFiles.leaves`)."""
    reader = pq.ParquetReader()
    reader.open(
        handle, metadata=footer, pre_buffer=True, arrow_extensions_enabled=True, **VERIFY_PAGES
    )
    return reader


def leaf_indices(reader: pq.ParquetReader, names: list[str]) -> list[int]:
    """The leaf columns under each top-level column of `names`, in their order, as
    `pq.ParquetFile.read_row_group(columns=names)` picks them; a name not in the file
    picks none (the codec then names the missing column)."""
    fields = reader.schema_arrow.names
    position = {name: index for index, name in enumerate(fields)}
    if reader.metadata.num_columns == len(fields) == len(position):  # flat: field i, leaf i
        return [position[name] for name in names if name in position]
    under: dict[str, list[int]] = {name: [] for name in names}
    for index, path in enumerate(reader.column_paths):
        if path[0] in under:
            under[path[0]].append(index)
    return [index for name in names for index in under[name]]


def check_footer(metadata: pq.FileMetaData, layout: Layout, group: int) -> None:
    """The footer must agree with the manifest on the shard's rows and this row group's."""
    shard = int(layout.group_shard[group])
    entry, uri = layout.entries[shard], layout.shard_uris[shard]
    found = (metadata.num_rows, metadata.num_row_groups)
    index = int(layout.group_index[group])
    group_rows = metadata.row_group(index).num_rows if index < metadata.num_row_groups else -1
    if found != (entry.num_rows, entry.num_row_groups) or group_rows != layout.group_rows[group]:
        raise ManifestError(
            f"shard {entry.path} ({uri}) has {metadata.num_rows} rows in "
            f"{metadata.num_row_groups} row groups (row group {index}: {group_rows}); the "
            f"manifest lists {entry.num_rows} rows in {entry.num_row_groups} of "
            f"{entry.rows_per_row_group}"
        )


def decode_rows(table: pa.Table, columns: Columns) -> Rows:
    """Arrow columns to numpy: features by the codec, labels to class indices."""
    features = columns.codec.encode(table)
    labels = label_indices(table.column(columns.label), list(columns.classes))
    ids = table.column(columns.id).to_numpy().astype(np.int64, copy=False)
    return Rows(features, labels, ids)
