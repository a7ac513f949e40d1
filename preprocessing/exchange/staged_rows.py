"""The rows a map task stages: their schema, one piece's rows read into it, their strata,
and rows grouped by destination written as one staged object.

Staged rows have the output schema with dictionaries decoded plus the keyed order column
(`staged_schema`); a piece's rows (`read_piece`) get the derived source and id columns
where the dataset has none, keep the rows the scan counted (less the copies that
`duplicates: drop` leaves out: the one place rows are dropped), say each one's split and,
under a group with `same_split`, tally their content for the manifest (`content_tally`
again for a map task a rerun kept);
`stratum_codes` looks each row's (label, source) up in a split's plan; `route_rows` reads
a group of pieces and routes every row, for the map task that stages them (`map_pieces`,
preprocessing/exchange/tasks.py) and the single pass that writes them
(preprocessing/exchange/single_pass.py) alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.config import DatasetSpec
from preprocessing.exchange.staged_objects import StagedObject, StagedWriter
from preprocessing.plan.counts import SPLITS, OffsetLists, dense_offsets, small_ints
from preprocessing.plan.key_tally import KeyCounts, exchange_content_tally, merge_keys
from preprocessing.plan.row_fates import route_pieces
from preprocessing.plan.row_ids import DERIVED_ID_COLUMN, derived_ids
from preprocessing.plan.split import SplitPlan
from preprocessing.plan.time_cut import TimeCut
from preprocessing.plan.validation_split import row_splits
from preprocessing.scan.columns import INTERNAL_PREFIX
from preprocessing.scan.content_pairs import DropLists
from preprocessing.scan.kept_rows import kept_rows
from preprocessing.scan.row_counts import row_sources
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import InputFile, read_rows

ORDER_COLUMN = f"{INTERNAL_PREFIX}order"
# A map task takes its rows in destination order this many bytes at a time: small enough
# that the allocator reuses one run's memory for the next, large enough that a take's
# fixed cost (a dozen calls) is nothing beside it.
RUN_BYTES = 8 << 20
DERIVED_SOURCE_COLUMN = "source"


@dataclass(frozen=True)
class PieceTask:
    """One row range of one input file."""

    piece: int
    file: InputFile
    first_row: int
    num_rows: int


@dataclass(frozen=True)
class Destinations:
    """What every map task shares: the plans (without piece offsets), the first
    destination number of each split, and the schema of staged rows."""

    plans: dict[str, SplitPlan]
    first: dict[str, int]
    count: int
    schema: pa.Schema
    time_cut: TimeCut | None = None  # the night's, under `holdout_by: newest`
    drops: DropLists | None = None  # the night's, under `duplicates: drop`


def staged_schema(schema: pa.Schema) -> pa.Schema:
    """The output schema with dictionaries decoded (every piece has its own) plus the
    order key; write tasks cast back to `schema`."""
    fields = [
        pa.field(f.name, f.type.value_type, f.nullable) if pa.types.is_dictionary(f.type) else f
        for f in schema
    ]
    return pa.schema([*fields, pa.field(ORDER_COLUMN, pa.uint64())])


def read_piece(
    task: PieceTask,
    destinations: Destinations,
    spec: DatasetSpec,
    seed: int,
    holdout_fraction: float,
) -> tuple[pa.Table, np.ndarray, KeyCounts]:
    """One piece's rows in the staged schema (without the order key), each one's split
    code (plan/counts.py: SPLITS), and where the exchange takes it the manifest's tally of
    the rows' content (`exchange_content_tally`: of the rows the scan counted, as read)."""
    rows = read_rows(task.file.uri, task.first_row, task.num_rows, reading=CsvReading.of(spec))
    table = rows.replace_schema_metadata(None)
    if spec.source_column is None:
        table = table.append_column(DERIVED_SOURCE_COLUMN, row_sources(table, spec, task.file))
    if spec.id_column is None:
        ids = derived_ids(task.file.relative_path, task.first_row, table.num_rows)
        table = table.append_column(DERIVED_ID_COLUMN, pa.array(ids, pa.int64()))
    path, first = task.file.relative_path, task.first_row
    splits = row_splits(table, spec, path, first, seed, holdout_fraction, destinations.time_cut)
    kept = kept_rows(table, spec).kept  # as the scan counted them, less the copies dropped
    if destinations.drops is not None:
        kept &= ~destinations.drops.dropped(task.file, task.first_row, table.num_rows)
    if not kept.all():
        table, splits = table.filter(pa.array(kept)), splits[kept]
    tally = exchange_content_tally(table, spec, splits)
    payload = table.select(payload_schema(destinations).names).cast(payload_schema(destinations))
    return payload, splits, tally


def content_tally(
    pieces: list[PieceTask],
    destinations: Destinations,
    spec: DatasetSpec,
    seed: int,
    holdout_fraction: float,
) -> KeyCounts:
    """The content tally a map task of `pieces` returns (tasks.py `map_pieces`), without
    routing or staging: for a map task whose staged object a rerun kept (driver/resume.py),
    so the manifest's figures are a clean run's. It reads the pieces again, a cost only a
    resumed run pays."""
    settings = (destinations, spec, seed, holdout_fraction)
    return merge_keys([read_piece(piece, *settings)[2] for piece in pieces])


def payload_schema(destinations: Destinations) -> pa.Schema:
    schema = destinations.schema
    return schema.remove(schema.get_field_index(ORDER_COLUMN))


def stratum_codes(
    table: pa.Table, plan: SplitPlan, spec: DatasetSpec, rows: np.ndarray | None = None
) -> np.ndarray:
    """Stratum index of every row (or of `rows`), by dictionary lookup (vectorised)."""
    labels = sorted({label for label, _ in plan.strata}, key=str)
    sources = sorted({source for _, source in plan.strata}, key=str)
    lookup = np.full((len(labels) + 1, len(sources) + 1), -1, dtype=np.int64)
    for index, (label, source) in enumerate(plan.strata):
        lookup[labels.index(label), sources.index(source)] = index
    source_name = spec.source_column or DERIVED_SOURCE_COLUMN
    codes = []
    for name, values in ((spec.label_column, labels), (source_name, sources)):
        code = pc.index_in(table.column(name), pa.array(values)).fill_null(len(values))
        codes.append(code.to_numpy())
    found = lookup[codes[0], codes[1]] if rows is None else lookup[codes[0][rows], codes[1][rows]]
    if (found < 0).any():
        raise ValueError("a row's (label, source) is missing from the plan; inputs changed?")
    return found


@dataclass(frozen=True)
class RoutedRows:
    """A group of pieces' rows as read (one chunk) and where each goes: `picks` (rows of
    `table`), their `targets` (destinations, ascending) and `order` keys (distinct); `keys`:
    the pieces' content tally, where the exchange takes it (`read_piece`)."""

    table: pa.Table
    picks: np.ndarray
    order: np.ndarray
    targets: np.ndarray
    keys: KeyCounts = field(default_factory=dict)


def route_rows(
    group: list[PieceTask],
    offsets: dict[str, OffsetLists],
    destinations: Destinations,
    spec: DatasetSpec,
    seed: int,
    holdout_fraction: float,
    over: Callable[..., Iterable[tuple[pa.Table, np.ndarray, KeyCounts]]] = map,
    block_bytes: int | None = None,
) -> RoutedRows:
    """Read a `group` of pieces (`offsets`: `piece_group`'s; `over`: how `read_piece` is
    mapped over them, a thread pool's `map` in a single pass) and route every row, in one
    vectorised pass: what a map task stages and a single pass (exchange/single_pass.py)
    writes straight away. The rows are kept in one chunk, or with `block_bytes` in
    chunks of about that many bytes (`table.to_batches()`: a single pass takes a shard's
    rows from each, as a take over chunks would join them all first)."""
    reading = partial(
        read_piece,
        destinations=destinations,
        spec=spec,
        seed=seed,
        holdout_fraction=holdout_fraction,
    )
    pieces_read = list(over(reading, group))
    tables = [table for table, _, _ in pieces_read]
    table = pa.concat_tables(tables) if tables else payload_schema(destinations).empty_table()
    splits = np.concatenate([m for _, m, _ in pieces_read]) if tables else np.zeros(0, np.int8)
    tally = merge_keys([piece_tally for _, _, piece_tally in pieces_read])
    piece_of = np.repeat(np.arange(len(tables)), [t.num_rows for t in tables])
    pieces = np.array([piece.piece for piece in group], dtype=np.int64)
    rows, targets, keys = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], []
    for split, plan in destinations.plans.items():
        members = np.flatnonzero(splits == SPLITS.index(split))
        if len(members):
            routing = route_pieces(
                stratum_codes(table, plan, spec, members),
                piece_of[members],
                dense_offsets(offsets[split], len(plan.strata)),
                plan,
                seed,
                pieces,
            )
            rows.append(members[routing.rows])
            targets.append(routing.shards + destinations.first[split])
            keys.append(routing.order_keys)
    target = np.concatenate(targets)
    by_target = np.argsort(small_ints(target), kind="stable")
    order = np.concatenate(keys)[by_target] if keys else np.zeros(0, dtype=np.uint64)
    # One chunk: a take from many chunks joins them first, and write_grouped takes a run
    # of destinations at a time. The pieces as read are let go column by column, so the
    # rows are held once and one column, not twice.
    schema, columns = table.schema, table.columns
    del pieces_read, table
    if block_bytes is None:
        del tables
        joined = pa.Table.from_arrays(_joined(columns), schema=schema)
    else:
        del columns
        joined = _blocks(tables, block_bytes, schema)
    return RoutedRows(joined, np.concatenate(rows)[by_target], order, target[by_target], tally)


def _joined(columns: list[Any]) -> list[Any]:
    """Each column in one chunk, replacing it in `columns` so its chunks are let go."""
    for index in range(len(columns)):
        columns[index] = columns[index].combine_chunks()
    return columns


def _blocks(tables: list[Any], block_bytes: int, schema: pa.Schema) -> pa.Table:
    """The rows of `tables` in chunks: each chunk of RUN_BYTES or more as read (no copy),
    runs of smaller ones joined into blocks of about `block_bytes`; each table let go (its
    entry in `tables` cleared) once gone through, so the rows are held once and a block."""
    blocks: list[pa.RecordBatch] = []
    run: list[pa.RecordBatch] = []
    run_bytes = 0
    for index in range(len(tables)):
        for batch in tables[index].to_batches():
            if batch.nbytes >= RUN_BYTES:
                blocks.extend([*_joined_run(run, schema), batch])
                run, run_bytes = [], 0
                continue
            run.append(batch)
            run_bytes += batch.nbytes
            if run_bytes >= block_bytes:
                blocks.extend(_joined_run(run, schema))
                run, run_bytes = [], 0
        tables[index] = None
    blocks.extend(_joined_run(run, schema))
    return pa.Table.from_batches(blocks, schema=schema)


def _joined_run(run: list[pa.RecordBatch], schema: pa.Schema) -> list[pa.RecordBatch]:
    if len(run) < 2:
        return run
    return pa.Table.from_batches(run, schema=schema).combine_chunks().to_batches()


def write_grouped(
    rows: pa.Table,
    picks: np.ndarray,
    order: np.ndarray,
    targets: np.ndarray,
    output: StagedObject,
    schema: pa.Schema,
    run_bytes: int = RUN_BYTES,
) -> int:
    """Write `rows[picks]` (sorted by destination: `targets`; `order`, their order keys;
    `rows` in one chunk: a take from many chunks joins them first, at every run) as the
    staged object `output`, one record batch per destination and run that has rows; its
    size in bytes. The rows are taken a run of about `run_bytes` at a time (whole
    destinations, or a part of a larger one), so a map task holds its rows once and one
    run, not a second copy of all of them in destination order (RESULTS.md M54)."""
    bounds = np.r_[0, np.cumsum(np.bincount(targets, minlength=output.num_destinations))]
    run_rows = max(1, int(run_bytes * rows.num_rows // max(1, rows.nbytes)))
    runs = iter(run_bounds(bounds, run_rows))
    writer, run, start = StagedWriter(output, schema), None, 0
    for first, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        parts = []
        while first < stop:
            if run is None or first >= start + run.num_rows:
                start, end = next(runs)
                run = _taken(rows, picks[start:end], order[start:end])
            taken = min(stop, start + run.num_rows) - first
            parts.append(run.slice(first - start, taken))
            first += taken
        writer.add_batches(parts)
    return writer.close()


def run_bounds(bounds: np.ndarray, run_rows: int) -> list[tuple[int, int]]:
    """[start, end) runs of rows cut at the destinations' `bounds` (cumulative rows from
    0), each of at most `run_rows` rows of whole destinations, or `run_rows` rows of one
    larger."""
    runs, start, total = [], 0, int(bounds[-1])
    while start < total:
        limit = start + run_rows
        whole = int(bounds[np.searchsorted(bounds, limit, side="right") - 1])
        end = whole if whole > start else min(limit, total)
        runs.append((start, end))
        start = end
    return runs


def _taken(rows: pa.Table, picks: np.ndarray, order: np.ndarray) -> pa.RecordBatch:
    """`rows[picks]` with the order key `order`, as one record batch."""
    taken = rows.take(pa.array(picks)).append_column(ORDER_COLUMN, pa.array(order, pa.uint64()))
    return taken.combine_chunks().to_batches()[0]
