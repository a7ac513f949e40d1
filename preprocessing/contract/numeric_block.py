"""Wide tables at Arrow's speed: the feature codec's numeric columns of one Arrow type,
encoded as one matrix (preprocessing/contract/codec.py builds the blocks).

A numeric column encoded alone costs about a dozen Arrow and numpy calls and a strided
write into the row-major matrix; on 5,000 columns that per-column cost, not Parquet's
decode, set the training loader's speed (issue 38: 0.41x a plain pyarrow read). A block
takes every numeric column of one type at once: one `RecordBatch.to_tensor` (a null as
NaN), one null count per column, one standardization. The arithmetic is the column
path's (float64 `(x - shift) / scale`, stored as float32), so every value is identical.
A type with fewer than MIN_BLOCK_COLUMNS columns keeps the column path: narrow tables
encode as they did.

Arrow checks a 64-bit integer's conversion to float64 (a value past 2**53 is an error on
the column path), so such a block is taken only when it holds no null and every value is
exact in float64; otherwise `encode` says no and the codec encodes those columns one by
one, as before. Depends on numpy and pyarrow only: it ships with every logged model, as
the codec does (tracking/run/model.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

Plan = tuple[list["NumericBlock"], list[tuple[Any, slice]]]
# Rows are standardized a slice of this many bytes at a time: the float64 temporaries stay
# in cache, and a wide row group's 80 MB of them are never allocated (page faults cost
# more than the arithmetic: 0.17 against 0.05 CPU-s per 2,048 x 5,000 row group).
STEP_BYTES = 1 << 20
# Fewer columns of a type go one by one: with thousands of rows a row group, the column
# path costs no more there (8,192 rows x 4 float64 columns: 0.15 ms against 0.22 ms).
MIN_BLOCK_COLUMNS = 64
EXACT_INTEGERS = 2**53  # float64 holds every integer up to this magnitude exactly
SIGNED = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
UNSIGNED = (pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())
BLOCK_TYPES = frozenset((pa.float32(), pa.float64(), *SIGNED, *UNSIGNED))
# A numeric type's id names it whole (no parameters), and an int hashes in nanoseconds
# where a DataType takes microseconds: 5,000 columns are grouped by id.
BLOCK_TYPE_IDS = frozenset(arrow_type.id for arrow_type in BLOCK_TYPES)


def plan_blocks(
    columns: Sequence[Any],
    starts: np.ndarray,
    schema: pa.Schema,
    refuse_nulls: Callable[[Any, int], None],
) -> Plan:
    """The numeric `columns` (ColumnSpecs, the first of each one's slots at `starts[i]`)
    in blocks by their Arrow type in `schema`, where a type has MIN_BLOCK_COLUMNS of
    them; every other column alone, with its slots, in the codec's order. Only arrays are
    made per column: a plan of 5,000 columns leaves no object per column in memory (each
    one the garbage collector would walk again at its next full pass)."""
    position, types = field_positions(schema), schema.types
    fields = np.fromiter((position[spec.name] for spec in columns), np.int64, len(columns))
    kinds = zip(columns, fields.tolist(), strict=True)
    keys = np.fromiter(
        (types[f].id if spec.kind == "numeric" else -1 for spec, f in kinds), np.int64, len(fields)
    )
    keys[~np.isin(keys, list(BLOCK_TYPE_IDS))] = -1
    found, first = np.unique(keys, return_index=True)
    blocks, loose = [], [np.zeros(0, np.int64)]
    for key in found[np.argsort(first)]:  # types in the order they first appear
        members = np.flatnonzero(keys == key)
        if key < 0 or len(members) < MIN_BLOCK_COLUMNS:
            loose.append(members)
            continue
        specs, block_fields = [columns[int(i)] for i in members], fields[members]
        arrow_type = types[int(block_fields[0])]
        blocks.append(NumericBlock(specs, starts[members], arrow_type, refuse_nulls, block_fields))
    rest = np.sort(np.concatenate(loose)).tolist()
    return blocks, [(columns[i], slots(columns[i], int(starts[i]))) for i in rest]


def slots(spec: Any, start: int) -> slice:
    """Where a column of the codec's `spec`, starting at `start`, sits in a row."""
    return slice(start, start + spec.width)


def field_positions(schema: pa.Schema) -> dict[str, int]:
    """Each column name's index in `schema`; a name held twice is refused, as
    `schema.field(name)` refuses it."""
    names = schema.names
    position = {name: index for index, name in enumerate(names)}
    if len(position) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise KeyError(f"columns {twice} exist more than once in the schema")
    return position


class NumericBlock:
    """Numeric columns of one Arrow type (ColumnSpecs of width 1, or 2 with an is-null
    indicator), the first slot of each at `starts[i]` of a row of the matrix, each at
    index `fields[i]` of the schema planned for."""

    def __init__(
        self,
        specs: Sequence[Any],
        starts: np.ndarray,
        arrow_type: pa.DataType,
        refuse_nulls: Callable[[Any, int], None],
        fields: np.ndarray,
    ) -> None:
        self.specs, self.refuse_nulls = tuple(specs), refuse_nulls
        self.starts = np.asarray(starts, dtype=np.int64)
        # By index: a select by 5,000 names looks each one up at every row group.
        self.fields: list[int] = np.asarray(fields).tolist()
        self.checked = pa.types.is_integer(arrow_type) and arrow_type.bit_width == 64
        self.shift, self.scale, self.fill = (
            np.array([getattr(spec, name) for spec in specs], dtype=np.float64)
            for name in ("shift", "scale", "fill")
        )
        starts = self.starts
        self.flagged = np.flatnonzero([spec.nulls == "indicator" for spec in specs])
        self.flags = starts[self.flagged] + 1
        # One run of slots (the usual table of plain numbers) is written as a slice.
        run = len(starts) > 0 and bool((np.diff(starts) == 1).all())
        self.values: slice | np.ndarray = slice(starts[0], starts[-1] + 1) if run else starts

    @property
    def parts(self) -> list[slice]:
        """Each column's slots in a row (for the codec's column-by-column path)."""
        pairs = zip(self.specs, self.starts.tolist(), strict=True)
        return [slots(spec, start) for spec, start in pairs]

    def encode(self, table: pa.Table, out: np.ndarray) -> bool:
        """Write the block's columns of `table` into their slots of `out`; False, with
        nothing written, when they must go column by column (see the module)."""
        numbers = self.matrix(table)
        if numbers is None:
            return False
        counts = np.zeros(len(self.specs), dtype=np.int64)
        step = max(1, STEP_BYTES // max(1, 8 * numbers.shape[1]))  # float64 bytes a row
        scratch = np.empty((min(step, len(numbers)), numbers.shape[1]))  # this call's own
        for start in range(0, len(numbers), step):
            rows = slice(start, start + step)
            counts += self.encode_rows(numbers[rows], out[rows], scratch)
        for index in np.flatnonzero(counts):  # raises under a policy that refuses nulls
            self.refuse_nulls(self.specs[index], int(counts[index]))
        return True

    def encode_rows(self, numbers: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> np.ndarray:
        """Standardize a few rows of the block into `out` (`scratch`: float64 room for as
        many rows); the nulls of each column."""
        plain = isinstance(self.values, slice) and not len(self.flags)
        if plain and not np.isnan(numbers.sum()):
            # No NaN (a NaN anywhere makes the sum NaN): float64 arithmetic in place in
            # the scratch rows, stored into the matrix as float32 once. In place, of one
            # type, numpy runs unbuffered: 0.55x the CPU of a subtract and a divide that
            # cast on the way, with the same bytes.
            values = scratch[: len(numbers)]
            values[...] = numbers
            values -= self.shift
            values /= self.scale
            out[:, self.values] = values
            return np.zeros(len(self.specs), np.int64)
        numbers = numbers.astype(np.float64, copy=False)  # float32: a step at a time
        nulls = np.isnan(numbers)  # a NaN is a null too, as on the column path
        counts = nulls.sum(axis=0) if nulls.any() else np.zeros(len(self.specs), np.int64)
        if counts.any():
            numbers = np.where(nulls, self.fill, numbers)
        values = np.subtract(numbers, self.shift)
        out[:, self.values] = np.divide(values, self.scale, out=values)
        if len(self.flags):
            out[:, self.flags] = nulls[:, self.flagged]
        return counts

    def matrix(self, table: pa.Table) -> np.ndarray | None:
        """[rows, columns] of the block (a null as NaN; float32 stays float32 here, every
        other type is float64), or None: no rows, or a 64-bit integer column with a null
        or a value float64 does not hold exactly."""
        block = table.select(self.fields)
        batches = block.to_batches()  # one when every column is one chunk (a row group)
        if len(batches) != 1:
            batches = block.combine_chunks().to_batches()
        if len(batches) != 1:
            return None
        try:
            numbers = batches[0].to_tensor(null_to_nan=not self.checked).to_numpy()
        except pa.ArrowTypeError:  # a null in a 64-bit integer column
            return None
        if self.checked and (numbers.max() > EXACT_INTEGERS or numbers.min() < -EXACT_INTEGERS):
            return None
        # float32 is widened a step at a time (`encode_rows`): a whole 2,048 x 5,000
        # row group's float64 copy cost more than its standardization.
        return numbers if numbers.dtype == np.float32 else numbers.astype(np.float64, copy=False)
