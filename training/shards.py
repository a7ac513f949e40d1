"""Read the row groups of a dataset split and decode them into numpy arrays.

The one place that touches shard files for training: footers once (to learn
every row group's size), then one row group at a time through fsspec. Column
names come from the manifest; a `fixed_size_list<float32>` feature column
becomes an [n, D] matrix without a copy, a numeric column one feature, and
labels become class indices in the order of `manifest.classes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from preprocessing.manifest import Manifest, ManifestError, ShardEntry, shard_uri


class ShardMissingError(FileNotFoundError):
    """A shard listed in the manifest cannot be opened."""


@dataclass(frozen=True)
class Columns:
    """The columns a batch is built from, named by the manifest."""

    label: str
    id: str
    features: tuple[str, ...]
    classes: tuple[Any, ...]

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> Columns:
        features = tuple(manifest.feature_columns)
        return cls(manifest.label_column, manifest.id_column, features, tuple(manifest.classes))

    @property
    def names(self) -> list[str]:
        return [self.id, self.label, *self.features]


@dataclass(frozen=True)
class Layout:
    """Where every row group of a split lives, and how many rows it holds."""

    shard_uris: tuple[str, ...]
    shard_paths: tuple[str, ...]
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

    def take(self, index: np.ndarray) -> Rows:
        return Rows(self.features[index], self.label[index], self.id[index])

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        if len(parts) == 1:
            return parts[0]
        return Rows(
            np.concatenate([part.features for part in parts]),
            np.concatenate([part.label for part in parts]),
            np.concatenate([part.id for part in parts]),
        )


def read_layout(manifest: Manifest, location: str, split: str, columns: Columns) -> Layout:
    """Row-group sizes of a split's shards from their footers, checked against the manifest."""
    entries = manifest.split(split).shards
    uris = tuple(shard_uri(location, entry) for entry in entries)
    shard: list[int] = []
    rows: list[int] = []
    num_features = 0
    for number, (entry, uri) in enumerate(zip(entries, uris, strict=True)):
        metadata = _read_footer(uri, entry.path)
        _check_footer(metadata, entry, uri, location)
        num_features = num_features or feature_width(metadata.schema.to_arrow_schema(), columns)
        shard += [number] * metadata.num_row_groups
        rows += [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    index = [g for entry in entries for g in range(entry.num_row_groups)]
    paths = tuple(entry.path for entry in entries)
    shard_array, index_array, rows_array = (np.asarray(v, np.int64) for v in (shard, index, rows))
    return Layout(uris, paths, shard_array, index_array, rows_array, num_features)


def _check_footer(metadata: pq.FileMetaData, entry: ShardEntry, uri: str, location: str) -> None:
    if (metadata.num_rows, metadata.num_row_groups) != (entry.num_rows, entry.num_row_groups):
        raise ManifestError(
            f"shard {entry.path} ({uri}) has {metadata.num_rows} rows in "
            f"{metadata.num_row_groups} row groups; the manifest at {location} lists "
            f"{entry.num_rows} rows in {entry.num_row_groups}"
        )


def _read_footer(uri: str, path: str) -> pq.FileMetaData:
    try:
        with fsspec.open(uri, "rb") as handle:
            return pq.read_metadata(handle)
    except FileNotFoundError as error:
        raise _missing(uri, path) from error


def _missing(uri: str, path: str) -> ShardMissingError:
    return ShardMissingError(f"shard {path} is listed in the manifest but missing: {uri}")


def feature_width(schema: pa.Schema, columns: Columns) -> int:
    """Features per sample: a fixed-size list column counts its size, a numeric column 1."""
    width = 0
    for name in columns.features:
        kind = schema.field(name).type
        if pa.types.is_fixed_size_list(kind):
            width += kind.list_size
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            width += 1
        else:
            raise ValueError(f"feature column {name!r} has type {kind}; expected a number or list")
    return width


def read_row_group(layout: Layout, group: int, columns: Columns) -> Rows:
    """Read and decode row group `group` of the layout."""
    shard = int(layout.group_shard[group])
    uri, path = layout.shard_uris[shard], layout.shard_paths[shard]
    try:
        with fsspec.open(uri, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            table = parquet.read_row_group(int(layout.group_index[group]), columns=columns.names)
    except FileNotFoundError as error:
        raise _missing(uri, path) from error
    return decode_rows(table, columns)


def decode_rows(table: pa.Table, columns: Columns) -> Rows:
    """Arrow columns to numpy: features zero-copy where possible, labels to class indices."""
    matrices = [feature_matrix(table.column(name)) for name in columns.features]
    features = matrices[0] if len(matrices) == 1 else np.concatenate(matrices, axis=1)
    labels = table.column(columns.label)
    class_values = pa.array(list(columns.classes)).cast(labels.type)
    index = pc.index_in(labels, value_set=class_values)
    if index.null_count:
        unknown = pc.unique(pc.filter(labels, pc.is_null(index))).to_pylist()[:5]
        raise ValueError(f"label values {unknown} are not among the manifest classes")
    ids = table.column(columns.id).to_numpy().astype(np.int64, copy=False)
    return Rows(features, index.to_numpy().astype(np.int64), ids)


def feature_matrix(column: pa.ChunkedArray) -> np.ndarray:
    """An [n, D] float32 matrix from a fixed-size list column, or [n, 1] from a scalar one."""
    array = column.combine_chunks()
    if array.null_count:
        raise ValueError(f"feature column of type {array.type} holds {array.null_count} nulls")
    if not pa.types.is_fixed_size_list(array.type):
        return array.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, 1)
    size = array.type.list_size
    values = array.values.slice(array.offset * size, len(array) * size)
    flat = values.to_numpy(zero_copy_only=False)
    return flat.astype(np.float32, copy=False).reshape(len(array), size)
