"""The rows a map task stages: their schema, one piece's rows read into it, their strata,
and rows grouped by destination written as one staged object.

Staged rows have the output schema with dictionaries decoded plus the keyed order column
(`staged_schema`); a piece's rows (`read_piece`) get the derived source and id columns
where the dataset has none, keep the rows the scan counted and say which are held out;
`stratum_codes` looks each row's (label, source) up in a split's plan. The map task that
routes them is `map_pieces` (preprocessing/exchange/tasks.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.config import DatasetSpec
from preprocessing.exchange.staged_objects import StagedObject, StagedWriter
from preprocessing.plan.row_fates import holdout_mask
from preprocessing.plan.row_ids import DERIVED_ID_COLUMN, derived_ids
from preprocessing.plan.split import SplitPlan
from preprocessing.scan.columns import INTERNAL_PREFIX
from preprocessing.scan.kept_rows import kept_rows
from preprocessing.scan.row_counts import row_sources
from preprocessing.storage.sources import InputFile, read_rows

ORDER_COLUMN = f"{INTERNAL_PREFIX}order"
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
) -> tuple[pa.Table, np.ndarray]:
    """One piece's rows in the staged schema (without the order key), and which of them
    are held out."""
    table = read_rows(task.file.uri, task.first_row, task.num_rows).replace_schema_metadata(None)
    if spec.source_column is None:
        table = table.append_column(DERIVED_SOURCE_COLUMN, row_sources(table, spec, task.file))
    if spec.id_column is None:
        ids = derived_ids(task.file.relative_path, task.first_row, table.num_rows)
        table = table.append_column(DERIVED_ID_COLUMN, pa.array(ids, pa.int64()))
    held_out = holdout_mask(
        task.file.relative_path, task.first_row, table.num_rows, seed, holdout_fraction
    )
    kept = kept_rows(table, spec).kept  # as the scan counted them
    if not kept.all():
        table, held_out = table.filter(pa.array(kept)), held_out[kept]
    return table.select(payload_schema(destinations).names).cast(
        payload_schema(destinations)
    ), held_out


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


def write_grouped(
    grouped: pa.Table, targets: np.ndarray, output: StagedObject, schema: pa.Schema
) -> int:
    """Rows sorted by destination, one record batch per destination that has rows."""
    batch = grouped.to_batches()[0] if grouped.num_rows else None
    bounds = np.r_[0, np.cumsum(np.bincount(targets, minlength=output.num_destinations))]
    writer = StagedWriter(output, schema)
    for start, stop in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        writer.add_batches([batch.slice(start, stop - start)] if stop > start and batch else [])
    return writer.close()
