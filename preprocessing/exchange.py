"""The row exchange: map tasks route a piece's rows to shard buckets, reduce tasks write shards.

A map task reads one piece (a row range of one file) and writes one Arrow IPC file to the
staging area holding one record batch per destination (split, shard). A reduce
task reads its batch from every piece file, orders the rows by their keyed
position and writes one zstd Parquet shard. Peak memory per task is about one
piece (times its oversampling factor) or one output shard.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from preprocessing.config import DatasetSpec
from preprocessing.manifest import ShardEntry
from preprocessing.plan import SplitPlan
from preprocessing.profile import drop_row_columns, null_rows
from preprocessing.resample import holdout_mask, route_rows, small_ints
from preprocessing.scan import INTERNAL_PREFIX, InputFile, row_sources
from preprocessing.sources import read_rows

SHARD_COLUMN = f"{INTERNAL_PREFIX}shard"
ORDER_COLUMN = f"{INTERNAL_PREFIX}order"
DERIVED_SOURCE_COLUMN = "source"


@dataclass(frozen=True)
class PieceTask:
    """One row range of one input file, with its plan offsets for each split."""

    piece: int
    file: InputFile
    first_row: int
    num_rows: int
    offsets: dict[str, dict[int, int]]
    staging_uri: str


@dataclass(frozen=True)
class Bucket:
    """Rows of piece file `uri`, batch `batch`, destined for shard `shard` of `split`."""

    split: str
    shard: int
    uri: str
    batch: int


def map_piece(task: PieceTask, plans: dict[str, SplitPlan], spec: DatasetSpec, seed: int,
              holdout_fraction: float) -> list[Bucket]:
    """Route one piece's rows to (split, shard) buckets in one staged IPC file."""
    table = read_rows(task.file.uri, task.first_row, task.num_rows).replace_schema_metadata(None)
    if spec.source_column is None:
        table = table.append_column(DERIVED_SOURCE_COLUMN, row_sources(table, spec, task.file))
    held_out = holdout_mask(task.file.relative_path, task.first_row, table.num_rows, seed,
                            holdout_fraction)
    kept = ~null_rows(table, drop_row_columns(spec))  # as the scan counted them
    if not kept.all():
        table, held_out = table.filter(pa.array(kept)), held_out[kept]
    parts = []
    for split, plan in plans.items():
        in_split = held_out if split == "holdout" else ~held_out
        if in_split.all():  # no copy when the whole piece belongs to one split
            parts.append((split, _route_split(table, plan, spec, task, seed)))
        elif in_split.any():
            rows = pa.array(np.flatnonzero(in_split))
            parts.append((split, _route_split(table.take(rows), plan, spec, task, seed)))
    return _write_buckets(parts, f"{task.staging_uri}/piece-{task.piece:06d}.arrow")


def stratum_codes(table: pa.Table, plan: SplitPlan, spec: DatasetSpec) -> np.ndarray:
    """Stratum index of every row, by dictionary lookup (vectorised, no Python loop)."""
    labels = sorted({label for label, _ in plan.strata}, key=str)
    sources = sorted({source for _, source in plan.strata}, key=str)
    lookup = np.full((len(labels), len(sources)), -1, dtype=np.int64)
    for index, (label, source) in enumerate(plan.strata):
        lookup[labels.index(label), sources.index(source)] = index
    source_name = spec.source_column or DERIVED_SOURCE_COLUMN
    label_code = pc.index_in(table.column(spec.label_column), pa.array(labels))
    source_code = pc.index_in(table.column(source_name), pa.array(sources))
    codes = lookup[label_code.to_numpy(zero_copy_only=False),
                   source_code.to_numpy(zero_copy_only=False)]
    if (codes < 0).any():
        raise ValueError("a row's (label, source) is missing from the plan; inputs changed?")
    return codes


def _route_split(table: pa.Table, plan: SplitPlan, spec: DatasetSpec, task: PieceTask,
                 seed: int) -> pa.Table:
    offsets = np.zeros(len(plan.strata), dtype=np.int64)
    for stratum, offset in task.offsets.get(plan.name, {}).items():
        offsets[stratum] = offset
    routing = route_rows(stratum_codes(table, plan, spec), offsets, plan, seed, task.piece)
    by_shard = np.argsort(small_ints(routing.shards), kind="stable")  # rows grouped by shard
    routed = table.take(pa.array(routing.rows[by_shard]))
    routed = routed.append_column(SHARD_COLUMN, pa.array(routing.shards[by_shard], pa.int32()))
    return routed.append_column(ORDER_COLUMN,
                                pa.array(routing.order_keys[by_shard], pa.uint64()))


def _write_buckets(parts: list[tuple[str, pa.Table]], uri: str) -> list[Bucket]:
    buckets: list[Bucket] = []
    if not parts:
        return buckets
    fs, path = url_to_fs(uri)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as sink, pa.ipc.new_file(sink, parts[0][1].schema) as writer:
        for split, table in parts:
            shards = table.column(SHARD_COLUMN).to_numpy()
            starts = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1]])
            for start, stop in zip(starts, np.r_[starts[1:], len(shards)], strict=True):
                piece = table.slice(start, stop - start).combine_chunks()
                writer.write_batch(piece.to_batches()[0])
                buckets.append(Bucket(split, int(shards[start]), uri, len(buckets)))
    return buckets


def reduce_shard(buckets: list[Bucket], expected_rows: int, uri: str, schema: pa.Schema,
                 spec: DatasetSpec, rows_per_row_group: int) -> ShardEntry:
    """Assemble one shard from its buckets in keyed order and write it as zstd Parquet."""
    batches = [_read_bucket(bucket) for bucket in buckets]
    table = pa.Table.from_batches(batches) if batches else schema.empty_table()
    if table.num_rows != expected_rows:
        raise RuntimeError(f"{uri}: assembled {table.num_rows} rows, plan says {expected_rows}")
    order = np.argsort(table.column(ORDER_COLUMN).to_numpy())  # keys are distinct
    table = table.take(pa.array(order)).drop_columns([SHARD_COLUMN, ORDER_COLUMN])
    table = table.select(schema.names).cast(schema)
    payload = memoryview(_parquet_bytes(table, rows_per_row_group, spec))
    _write_file(uri, payload)
    source_name = spec.source_column or DERIVED_SOURCE_COLUMN
    return ShardEntry(
        path=uri.rsplit("/", 1)[-1], num_rows=table.num_rows, num_bytes=payload.nbytes,
        num_row_groups=-(-table.num_rows // rows_per_row_group),
        rows_per_row_group=rows_per_row_group,
        sha256=hashlib.sha256(payload).hexdigest(),
        class_counts=_histogram(table.column(spec.label_column)),
        source_counts=_histogram(table.column(source_name)),
    )


def _read_bucket(bucket: Bucket) -> pa.RecordBatch:
    fs, path = url_to_fs(bucket.uri)
    if isinstance(fs, LocalFileSystem):  # mapped: no copy until the shard's sort
        return pa.ipc.open_file(pa.memory_map(path)).get_batch(bucket.batch)
    with fs.open(path, "rb") as handle:
        return pa.ipc.open_file(handle).get_batch(bucket.batch)


def _parquet_bytes(table: pa.Table, rows_per_row_group: int, spec: DatasetSpec) -> pa.Buffer:
    # Dictionary-encode only the low-cardinality label and source columns: on float and id
    # columns the dictionary is useless and made writing about 3x slower. An Arrow buffer,
    # not BytesIO: no regrowth copies and no copy out.
    # Statistics on scalar columns only: min/max over the elements of a list column (an
    # embedding) prune nothing, and skipping them made encoding about 6% faster.
    dictionary = [spec.label_column, spec.source_column or DERIVED_SOURCE_COLUMN]
    scalar = [field.name for field in table.schema if not pa.types.is_nested(field.type)]
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=rows_per_row_group, compression="zstd",
                   write_statistics=scalar, use_dictionary=dictionary)
    return sink.getvalue()


def _write_file(uri: str, payload: memoryview) -> None:
    fs, path = url_to_fs(uri)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if isinstance(fs, LocalFileSystem):
        with open(path, "wb") as sink:
            sink.write(payload)
    else:
        fs.pipe_file(path, payload.tobytes())


def _histogram(column: pa.ChunkedArray) -> dict[str, int]:
    counts = pc.value_counts(column).to_pylist()
    return {str(item["values"]): int(item["counts"]) for item in counts}
