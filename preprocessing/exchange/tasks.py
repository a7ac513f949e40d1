"""The row exchange: map tasks route pieces' rows to destinations, write tasks make shards.

A map task reads a group of consecutive pieces (row ranges of input files), routes all
their rows to their destinations (shards of the splits, numbered across splits) in one
vectorised pass and writes one staged object with the rows grouped by destination
(`preprocessing/exchange/staged_objects.py`); merge rounds, if any, combine such objects
(`preprocessing/plan/layout.py`). A write task takes a run of consecutive shards, reads
their range of each object of the last round (one ranged read each), orders each shard's
rows by their keyed position and writes it (`preprocessing/contract/shards.py`). Rows are
ordered by distinct keys, so a shard's bytes do not depend on how pieces were grouped, how
many rounds there were, or which worker ran what. Peak memory per task is about
`exchange_task_bytes` of rows (a map task's pieces times their oversampling, a write
task's shards). The driver makes each task's descriptor here too (`exchange_layout`,
`map_task`, `shard_jobs`), one per task, never one per (piece, shard) pair. What a map task
stages, row by row, is `preprocessing/exchange/staged_rows.py`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import chain, pairwise

import numpy as np
import pyarrow as pa
from fsspec.core import url_to_fs

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import ShardEntry, shard_name
from preprocessing.contract.shards import EncodeBuffer, ShardSlices, write_shard
from preprocessing.exchange.receipts import write_shard_receipt
from preprocessing.exchange.shard_slices import Blocks, keyed_slices
from preprocessing.exchange.staged_objects import (
    StagedObject,
    destination_batches,
    merge_staged,
    read_destinations,
)
from preprocessing.exchange.staged_rows import (
    DERIVED_SOURCE_COLUMN,
    ORDER_COLUMN,
    Destinations,
    PieceTask,
    route_rows,
    staged_schema,
    write_grouped,
)
from preprocessing.plan.counts import OffsetLists, PieceOffsets
from preprocessing.plan.key_tally import KeyCounts
from preprocessing.plan.layout import LOCAL_DEFAULT_FAN_IN, ExchangeLayout, plan_exchange
from preprocessing.plan.split import SplitPlan
from preprocessing.plan.time_cut import TimeCut
from preprocessing.scan.content_pairs import DropLists
from preprocessing.scan.inputs import FileScan
from preprocessing.storage.objects import DEFAULT_PART_BYTES, is_local

# Shards of fewer staged bytes than this together are put in keyed order by one take: a
# shard of a few thousand rows cost about 15 pyarrow and numpy calls of its own, most of
# its write (benchmarks/RESULTS.md M36); a larger shard is taken in order alone, a slice at
# a time as it is written (exchange/shard_slices.py).
ORDER_RUN_BYTES = 8 << 20
# Each worker thread keeps its write tasks' encode buffer for its next write task, until
# the write stage ends (`release_encode_buffers`): at 8 GB a task writes one 330 MB
# shard, and a buffer new for each took 0.2-0.3 s a shard more (benchmarks/RESULTS.md M54).
_ENCODE_BUFFERS: dict[int, EncodeBuffer] = {}
_ENCODE_LOCK = threading.Lock()


@dataclass(frozen=True)
class MapTask:
    """Consecutive pieces whose rows go into the staged object `output`, with each
    split's within-stratum offsets of the pieces' first rows (`PieceOffsets.flat`)."""

    pieces: list[PieceTask]
    output: StagedObject
    offsets: dict[str, OffsetLists]


@dataclass(frozen=True)
class Staging:
    """Where a run's staged objects are, their layout and their rows' schema: all a merge
    or write task needs to find what it reads (shipped once to every worker)."""

    uri: str
    layout: ExchangeLayout
    schema: pa.Schema
    part_bytes: int = DEFAULT_PART_BYTES  # of multipart uploads: staged objects and shards
    receipts: bool = False  # each object gets its receipt (exchange/receipts.py)

    def round_uri(self, round_index: int) -> str:
        """Where the objects of round `round_index` are (0: the map tasks')."""
        return f"{self.uri}/round-{round_index}"

    def object(self, round_index: int, object_id: int) -> StagedObject:
        first, stop = self.layout.object_destinations(round_index, object_id)
        return StagedObject(
            f"{self.round_uri(round_index)}/part-{object_id:07d}.arrow",
            first,
            stop - first,
            self.part_bytes,
            self.receipts,
        )


def exchange_layout(
    scans: list[FileScan],
    plans: dict[str, SplitPlan],
    pieces: np.ndarray,
    config: ReshardConfig,
    threads: int,
) -> ExchangeLayout:
    """Map, merge and write tasks of about `exchange_task_bytes`, at least 4 per thread."""
    piece_bytes, shard_bytes = planned_bytes(scans, plans, pieces)
    return plan_exchange(
        piece_bytes,
        shard_bytes,
        config.exchange_task_bytes,
        min_tasks=4 * threads,
        fan_in=default_fan_in(config),
        rounds=config.exchange_rounds,
    )


def planned_bytes(
    scans: list[FileScan], plans: dict[str, SplitPlan], pieces: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every piece's input bytes and every shard's (its rows at the input's bytes per row
    as stored): what sizes the exchange's tasks."""
    _, rows, piece_bytes = piece_rows(scans, pieces)
    row_bytes = piece_bytes.sum() / max(1, int(rows.sum()))
    shard_bytes = np.concatenate([plan.shard_rows() for plan in plans.values()]) * row_bytes
    return piece_bytes, shard_bytes


def decoded_input(
    scans: list[FileScan], plans: dict[str, SplitPlan]
) -> tuple[int, int, np.ndarray]:
    """The accepted inputs' decoded bytes (FileScan.decoded_bytes), their rows and every
    shard's rows: what chooses the route (plan/route.py), with the accepted files' count."""
    accepted = [scan for scan in scans if scan.reason is None]
    shard_rows = np.concatenate([plan.shard_rows() for plan in plans.values()])
    decoded = sum(scan.decoded_bytes for scan in accepted)
    return decoded, sum(sum(scan.piece_rows) for scan in accepted), shard_rows


def default_fan_in(config: ReshardConfig) -> int | None:
    """The configured fan-in; unset, LOCAL_DEFAULT_FAN_IN where the staging is local (under a local
    output root), else None (the layout's object-store default, `plan/layout.py`). A local
    read is a memory map of the page cache with no per-request cost, while a merge round
    copies every staged row once more: 8 GB in 125 map objects spent about a third of its
    exchange on one (benchmarks/RESULTS.md M36)."""
    if config.exchange_fan_in is not None:
        return config.exchange_fan_in
    return LOCAL_DEFAULT_FAN_IN if is_local(url_to_fs(config.output_root)[0]) else None


def destinations_for(
    plans: dict[str, SplitPlan],
    schema: pa.Schema,
    time_cut: TimeCut | None = None,
    drops: DropLists | None = None,
) -> Destinations:
    """Destinations are the shards of every split, numbered one split after the other;
    `time_cut`: the night's, under a time holdout (preprocessing/plan/time_cut.py);
    `drops`: the night's drop lists, under `duplicates: drop` (scan/content_pairs.py)."""
    first = dict(
        zip(plans, np.cumsum([0, *(p.num_shards for p in plans.values())]).tolist(), strict=False)
    )
    slim = {name: replace(plan, piece_offsets=PieceOffsets.empty()) for name, plan in plans.items()}
    return Destinations(
        slim,
        first,
        sum(p.num_shards for p in plans.values()),
        staged_schema(schema),
        time_cut,
        drops,
    )


def piece_rows(
    scans: list[FileScan], pieces: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first row in its file, rows, input bytes) of every piece, in one vectorised pass
    over the accepted files' pieces (`pieces` lists them file by file); a piece's bytes
    are its file's in proportion to its rows."""
    accepted = [scan for scan in scans if scan.reason is None]
    counts = np.array([len(scan.piece_rows) for scan in accepted], dtype=np.int64)
    rows = np.fromiter(
        chain.from_iterable(scan.piece_rows for scan in accepted), np.int64, int(counts.sum())
    )
    if len(rows) != len(pieces):
        raise ValueError(f"{len(pieces)} pieces planned, {len(rows)} scanned")
    file_of = np.repeat(np.arange(len(accepted)), counts)
    file_start = np.cumsum(counts) - counts
    before = np.cumsum(rows) - rows
    file_rows = np.add.reduceat(rows, file_start) if len(rows) else rows
    file_bytes = np.array([scan.file.num_bytes for scan in accepted], dtype=np.float64)
    sizes = file_bytes[file_of] * rows / np.maximum(file_rows[file_of], 1)
    return before - before[file_start][file_of], rows, sizes


def map_task(
    scans: list[FileScan],
    plans: dict[str, SplitPlan],
    pieces: np.ndarray,
    first_rows: np.ndarray,
    staging: Staging,
    task: int,
) -> MapTask:
    """Map task `task`'s descriptor: its pieces ((scan index, piece in file) in `pieces`)
    and their offsets."""
    first, stop = (int(bound) for bound in staging.layout.map_bounds[task : task + 2])
    members, offsets = piece_group(scans, plans, pieces, first_rows, first, stop)
    return MapTask(members, staging.object(0, task), offsets)


def piece_group(
    scans: list[FileScan],
    plans: dict[str, SplitPlan],
    pieces: np.ndarray,
    first_rows: np.ndarray,
    first: int,
    stop: int,
) -> tuple[list[PieceTask], dict[str, OffsetLists]]:
    """Pieces [first, stop) ((scan index, piece in file) in `pieces`) to read, and each
    split's offsets of their first rows."""
    members = [
        PieceTask(
            piece,
            scans[scan_index].file,
            int(first_rows[piece]),
            scans[scan_index].piece_rows[index_in_file],
        )
        for piece, (scan_index, index_in_file) in enumerate(
            pieces[first:stop].tolist(), start=first
        )
    ]
    return members, {name: plan.piece_offsets.flat(first, stop) for name, plan in plans.items()}


def shard_jobs(
    plans: dict[str, SplitPlan], shard_uri: Callable[[str], str]
) -> list[tuple[int, str]]:
    """(planned rows, URI to write it to) of every shard, in destination order;
    `shard_uri` maps a shard's name to where this attempt writes it."""
    return [
        (int(rows), shard_uri(shard_name(split, shard)))
        for split, plan in plans.items()
        for shard, rows in enumerate(plan.shard_rows())
    ]


def map_pieces(
    task: MapTask, destinations: Destinations, spec: DatasetSpec, seed: int, holdout_fraction: float
) -> tuple[int, KeyCounts]:
    """Route a group of pieces' rows into one staged object, grouped by destination; the
    object's size in bytes, and the rows' content tally where the exchange takes it
    (staged_rows.read_piece)."""
    routed = route_rows(task.pieces, task.offsets, destinations, spec, seed, holdout_fraction)
    written = write_grouped(
        routed.table,
        routed.picks,
        routed.order,
        routed.targets,
        task.output,
        destinations.schema,
    )
    return written, routed.keys


def merge_task(round_index: int, task: int, staging: Staging) -> int:
    """Merge task `task` of a round: its block of each of its inputs into one object."""
    inputs = [
        staging.object(round_index - 1, item)
        for item in staging.layout.merge_inputs(round_index, task)
    ]
    return merge_staged(inputs, staging.object(round_index, task), staging.schema)


def write_shards(
    first: int,
    shards: list[tuple[int, str]],
    staging: Staging,
    schema: pa.Schema,
    spec: DatasetSpec,
    rows_per_row_group: int,
    receipts: str | None = None,
) -> list[ShardEntry]:
    """Write the shards of destinations [first, first + len(shards)) ((planned rows, URI)
    each): one range read per last-round object, then each shard in keyed order; then,
    given the attempt's URI as `receipts`, the task's receipt (exchange/receipts.py)."""
    own = _staged_batches(staging, first, first + len(shards))
    encode = thread_encode_buffer()  # for the task's shards, and the thread's next task
    source = spec.source_column or DERIVED_SOURCE_COLUMN
    settings = (rows_per_row_group, spec.label_column, source, staging.part_bytes)
    entries: list[ShardEntry] = []
    etags: dict[str, str] = {}  # on S3, what the receipt records of each shard
    for run_start, run_stop in order_runs([sum(b.nbytes for b in batches) for batches in own]):
        if run_stop - run_start == 1:  # a shard of its own: taken in slices as written
            keyed = _keyed(own[run_start], shards[run_start], staging, schema, settings[0])
            entries.append(write_shard(shards[run_start][1], keyed, *settings, encode, etags))
            continue
        table, offset = _ordered(own[run_start:run_stop], shards[run_start:run_stop], staging), 0
        for rows, uri in shards[run_start:run_stop]:
            piece = table.slice(offset, rows).cast(schema)
            entries.append(write_shard(uri, piece, *settings, encode, etags))
            offset += rows
    if receipts is not None:
        write_shard_receipt(receipts, first, entries, etags)
    return entries


def thread_encode_buffer() -> EncodeBuffer:
    """This thread's encode buffer, kept across its write tasks (see _ENCODE_BUFFERS)."""
    with _ENCODE_LOCK:
        return _ENCODE_BUFFERS.setdefault(threading.get_ident(), EncodeBuffer())


def release_encode_buffers() -> int:
    """Let every thread's encode buffer go (run on each worker when the write stage ends);
    how many there were."""
    with _ENCODE_LOCK:
        count = len(_ENCODE_BUFFERS)
        _ENCODE_BUFFERS.clear()
    return count


def _staged_batches(staging: Staging, first: int, stop: int) -> list[list[pa.RecordBatch]]:
    """Each of destinations [first, stop)'s staged batches, from one range read per
    last-round object."""
    last = len(staging.layout.rounds) - 1
    decoded = [
        destination_batches(
            *read_destinations(staging.object(last, item), first, stop), staging.schema
        )
        for item in staging.layout.write_inputs(first)
    ]
    return [
        [batch for by_destination in decoded for batch in by_destination[index]]
        for index in range(stop - first)
    ]


def order_runs(shard_bytes: list[int]) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive shards, each of at most ORDER_RUN_BYTES of staged
    rows together, or of one larger shard."""
    runs, start, total = [], 0, 0
    for index, size in enumerate(shard_bytes):
        if index > start and total + size > ORDER_RUN_BYTES:
            runs.append((start, index))
            start, total = index, 0
        total += size
    return [*runs, (start, len(shard_bytes))] if shard_bytes else runs


def _keyed(
    batches: list[pa.RecordBatch],
    shard: tuple[int, str],
    staging: Staging,
    schema: pa.Schema,
    rows_per_row_group: int,
) -> ShardSlices:
    """A shard's staged rows (`batches`) in keyed order, without the order key, as slices."""
    _check_rows([sum(batch.num_rows for batch in batches)], [shard])
    keys = np.concatenate(
        [np.zeros(0, np.uint64), *(batch.column(ORDER_COLUMN).to_numpy() for batch in batches)]
    )
    rows = [batch.drop_columns([ORDER_COLUMN]) for batch in batches]
    blocks = Blocks.of(rows, staging.schema.remove(staging.schema.get_field_index(ORDER_COLUMN)))
    return keyed_slices(blocks, np.argsort(keys), schema, rows_per_row_group)


def _check_rows(counts: list[int], shards: list[tuple[int, str]]) -> None:
    for found, (rows, uri) in zip(counts, shards, strict=True):
        if found != rows:
            raise RuntimeError(f"{uri}: assembled {found} rows, plan says {rows}")


def _ordered(
    own: list[list[pa.RecordBatch]], shards: list[tuple[int, str]], staging: Staging
) -> pa.Table:
    """The staged rows of a run of shards (`own`: each shard's batches), each shard's in
    keyed order, one shard after the other, in one chunk, without the order key."""
    counts = [sum(batch.num_rows for batch in batches) for batches in own]
    _check_rows(counts, shards)
    table = pa.Table.from_batches([b for batches in own for b in batches], schema=staging.schema)
    keys, bounds = table.column(ORDER_COLUMN).to_numpy(), np.cumsum([0, *counts])
    order = np.concatenate(
        [np.zeros(0, dtype=np.int64), *(np.argsort(keys[a:b]) + a for a, b in pairwise(bounds))]
    )
    # One chunk whatever the number of inputs: the encoder's pages follow the chunks. The
    # cast to the output schema is per shard: a dictionary's values follow the shard's rows.
    return table.take(pa.array(order)).combine_chunks().drop_columns([ORDER_COLUMN])
