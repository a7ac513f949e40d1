"""The feature codec: a dataset's feature columns (Arrow) in, one float32 matrix out.

Every reader of a version encodes rows through this module: the training loader
(training/data/shards.py), evaluation and batch inference (tracking/lifecycle/scoring.py). Its
state is a plain JSON-able `ColumnSpec` per feature column, gathered by the scan
(preprocessing/scan/feature_stats.py) and stored in the manifest (`Manifest.features["columns"]`),
so the same row gives the same numbers everywhere. Numeric columns of one Arrow type are
encoded as one matrix (preprocessing/contract/numeric_block.py); a column's kind and spec
are preprocessing/contract/column_spec.py. It depends on the standard library, numpy and
pyarrow only (docs/architecture.md 1): every logged model carries this module and those two
(tracking/run/model.py); the manifest is imported only to read one.
Column kinds, and what each becomes:

- `numeric` (integers, floats, decimals of any width): one value, standardized as
  `(x - shift) / scale` (the scan's mean and standard deviation; 0 and 1 when
  `dataset.standardize` is off);
- `boolean`: 0 or 1;
- `temporal` (timestamps, dates, times of day, durations; strings of ISO 8601 dates or
  timestamps named in `dataset.date_columns`, parsed as UTC where they carry no offset):
  seconds since the epoch (or midnight), standardized like numbers;
- `vector` (fixed-size lists of numbers, e.g. embeddings): its `size` values, as they are;
- `sequence` (variable-length lists of numbers, e.g. token ids): the first `size` values,
  padded with 0, then `size` mask values (1 where an element is real);
- `category` (strings): one-hot over 1 + `len(vocabulary)` slots, slot 0 for a value
  outside the vocabulary (unseen, or null under a fill policy); with `num_buckets`, over
  1 + `num_buckets` slots by a stable hash of the value instead.

Nulls follow the column's policy (`dataset.nulls`), decided at reshard time: `drop_row`
rows never reach the shards; `fill_zero` and `fill_mean` put 0 or the scan's mean in
place of a null before standardizing (a null list: no elements; a null string: slot 0);
`indicator` fills the mean and adds a 0/1 is-null value after the column's value.
Under `error` and `drop_row` a null met while encoding (rows from outside the version)
raises `FeatureError` naming the column.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field, fields
from functools import cached_property
from itertools import starmap
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.contract.column_spec import (
    FILL_POLICIES,
    SCALAR_KINDS,
    ColumnSpec,
    FeatureError,
    kind_of,
    parse_timestamps,
)
from preprocessing.contract.numeric_block import Plan, plan_blocks

if TYPE_CHECKING:  # imported when needed: a logged model ships no manifest module
    from preprocessing.contract.manifest import Manifest

_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
_FIXED_SIZE_LIST = re.compile(r"fixed_size_list<.*>\[(\d+)\]")
# A keys view: its `__eq__` with another dict's keys is a bool (a frozenset's is not).
_SPEC_FIELDS = dict.fromkeys(item.name for item in fields(ColumnSpec)).keys()
_spec_values = itemgetter(*_SPEC_FIELDS)


@dataclass(frozen=True)
class FeatureCodec:
    """The feature columns of a dataset in order; `encode` gives the model's input matrix."""

    columns: tuple[ColumnSpec, ...]
    _plans: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def width(self) -> int:
        return sum(spec.width for spec in self.columns)

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.columns]

    def slices(self) -> dict[str, slice]:
        """Where each column's values sit in a row of the matrix."""
        bounds = np.cumsum([0, *(spec.width for spec in self.columns)])
        return {
            spec.name: slice(int(start), int(stop))
            for spec, start, stop in zip(self.columns, bounds[:-1], bounds[1:], strict=True)
        }

    def encode(self, table: pa.Table) -> np.ndarray:
        """float32 [rows, width]: every feature column of `table`, encoded by its spec."""
        blocks, rest = self._plan(table.schema)  # names the feature columns the rows lack
        if len(self.columns) == 1 and (view := _plain_vector(self.columns[0], table)) is not None:
            return view
        out = np.empty((table.num_rows, self.width), dtype=np.float32)
        for block in blocks:  # one matrix per block: no per-column work for wide tables
            if not block.encode(table, out):
                rest = [*rest, *zip(block.specs, block.parts, strict=True)]
        for spec, part in rest:
            column = table.column(spec.name)
            array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
            ENCODERS[spec.kind](spec, array, out[:, part])
        return out

    def _plan(self, schema: pa.Schema) -> Plan:
        """How `schema`'s columns are encoded, kept for the last schema seen: every row
        group of a version has the same, and planning 5,000 columns costs milliseconds
        (a schema that lacks a feature column is refused here, naming it)."""
        last = self._plans.get("last")
        if last is None or not last[0].equals(schema):
            names = schema.names
            present = set(names)
            missing = [name for name in self.names if name not in present]
            if missing:
                raise FeatureError(
                    f"feature columns {missing} are missing from the rows (columns: {names})"
                )
            widths = np.fromiter((spec.width for spec in self.columns), np.int64)
            starts = np.cumsum(widths) - widths
            plan = plan_blocks(self.columns, starts, schema, _refuse_nulls)
            last = self._plans["last"] = (schema, plan)
        return last[1]

    def to_json(self) -> list[dict[str, Any]]:
        # As `asdict`, without its deep copy of every field (0.3 s for 5,000 columns).
        names = [item.name for item in fields(ColumnSpec)]
        return [
            {**{name: getattr(spec, name) for name in names}, "vocabulary": list(spec.vocabulary)}
            for spec in self.columns
        ]

    @classmethod
    def from_json(cls, columns: list[dict[str, Any]]) -> FeatureCodec:
        # Specs as `to_json` writes them (every field named) are built by position: on
        # 5,000 columns, 0.65x the CPU of matching keywords; any other goes by keyword,
        # which refuses an unknown or missing field as it always did.
        if all(map(_SPEC_FIELDS.__eq__, map(dict.keys, columns))):
            return cls(tuple(starmap(ColumnSpec, map(_spec_values, columns))))
        return cls(tuple(ColumnSpec(**column) for column in columns))

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> FeatureCodec:
        """The codec the reshard stored, or, for a version written without one (generated
        datasets), plain specs derived from the manifest's schema: nothing standardized."""
        if manifest.features.get("columns"):
            return cls.from_json(manifest.features["columns"])
        types = {item["name"]: item["type"] for item in manifest.arrow_schema}
        return cls(
            tuple(_spec_from_type_name(name, types.get(name)) for name in manifest.feature_columns)
        )

    @classmethod
    def from_schema(cls, schema: pa.Schema, names: list[str]) -> FeatureCodec:
        """Plain specs (nothing standardized, nulls refused) for columns of `schema`;
        variable-length lists need a length, so they are refused here."""
        present = set(schema.names)
        missing = [name for name in names if name not in present]
        if missing:
            raise FeatureError(
                f"feature columns {missing} are missing from the rows (columns: {schema.names})"
            )
        return cls(tuple(_plain_spec(name, schema.field(name).type) for name in names))


def _spec_from_type_name(name: str, type_name: str | None) -> ColumnSpec:
    from preprocessing.contract.manifest import ManifestError

    if type_name is None:
        raise ManifestError(f"feature column {name!r} is not in the manifest's schema")
    if match := _FIXED_SIZE_LIST.fullmatch(type_name):
        return ColumnSpec(name, "vector", type_name, size=int(match[1]))
    try:
        arrow_type = pa.type_for_alias(type_name)
    except (ValueError, KeyError):
        arrow_type = None
    if arrow_type is None or kind_of(arrow_type) not in ("numeric", "boolean"):
        raise ManifestError(
            f"feature column {name!r} has type {type_name} and the manifest "
            "holds no feature codec for it; reshard the inputs again"
        )
    return ColumnSpec(name, kind_of(arrow_type) or "numeric", type_name)


def _plain_spec(name: str, arrow_type: pa.DataType) -> ColumnSpec:
    kind = kind_of(arrow_type)
    if kind in SCALAR_KINDS:
        return ColumnSpec(name, kind, str(arrow_type))
    if kind == "vector":
        return ColumnSpec(name, kind, str(arrow_type), size=arrow_type.list_size)
    raise FeatureError(
        f"feature column {name!r} of type {arrow_type} needs the codec of its "
        "dataset version (a vocabulary or a sequence length)"
    )


def _plain_vector(spec: ColumnSpec, table: pa.Table) -> np.ndarray | None:
    """[n, size] float32 over a float32 vector column's values, without a copy: a
    fixed-size list, or a list of `size` values a row (as shards store vectors from
    format 3); None when the column needs the general path (another type, size or nulls)."""
    arrow_type = table.schema.field(spec.name).type
    if not (
        spec.kind == "vector"
        and (pa.types.is_fixed_size_list(arrow_type) or pa.types.is_list(arrow_type))
        and pa.types.is_float32(arrow_type.value_type)
    ):
        return None
    column = table.column(spec.name)
    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if array.null_count:
        return None
    if pa.types.is_fixed_size_list(arrow_type):
        if arrow_type.list_size != spec.size:
            return None
        start = array.offset * spec.size
    else:
        offsets = array.offsets.to_numpy()
        if (np.diff(offsets) != spec.size).any():
            return None
        start = int(offsets[0])
    values = array.values.slice(start, len(array) * spec.size)
    if values.null_count:
        return None
    return values.to_numpy(zero_copy_only=False).reshape(len(array), spec.size)


def _refuse_nulls(spec: ColumnSpec, count: int, what: str = "nulls") -> None:
    if count and spec.nulls not in FILL_POLICIES:
        raise FeatureError(
            f"feature column {spec.name!r} holds {count} {what}; its null policy is "
            f"{spec.nulls!r} (dataset.nulls), so rows with nulls there cannot be encoded"
        )


def seconds(array: pa.Array) -> pa.Array:
    """A temporal array (or ISO 8601 strings) as float64 seconds (since the epoch, or
    midnight for times)."""
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        array = parse_timestamps(array)
    arrow_type = array.type
    if pa.types.is_date32(arrow_type):
        return pc.multiply(array.cast(pa.int32()).cast(pa.float64()), 86_400.0)
    unit = "ms" if pa.types.is_date64(arrow_type) else arrow_type.unit
    integers = pa.int32() if arrow_type.bit_width == 32 else pa.int64()
    return pc.multiply(array.cast(integers).cast(pa.float64()), _UNIT_SECONDS[unit])


def _encode_scalar(spec: ColumnSpec, array: pa.Array, out: np.ndarray) -> None:
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    try:
        values = seconds(array) if spec.kind == "temporal" else array.cast(pa.float64())
    except FeatureError as error:
        raise FeatureError(f"feature column {spec.name!r}: {error}") from None
    numbers = values.to_numpy(zero_copy_only=False)  # a null is NaN here
    # NaN is a null too, as in the scan's counts (preprocessing/scan/feature_stats.py).
    may_be_null = values.null_count or pa.types.is_floating(array.type)
    nulls = np.isnan(numbers) if may_be_null else np.zeros(len(numbers), dtype=bool)
    num_nulls = int(nulls.sum()) if may_be_null else 0
    _refuse_nulls(spec, num_nulls)
    if num_nulls:
        numbers = np.where(nulls, spec.fill, numbers)
    out[:, 0] = (numbers - spec.shift) / spec.scale
    if spec.nulls == "indicator":
        out[:, 1] = nulls


def _list_values(spec: ColumnSpec, array: pa.Array) -> np.ndarray:
    """The elements of the non-null lists, in order, as float32 (null elements filled)."""
    values = pc.list_flatten(array)
    _refuse_nulls(spec, values.null_count, "null list elements")
    if values.null_count:
        values = pc.fill_null(values.cast(pa.float32()), 0.0)
    return values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)


def _encode_vector(spec: ColumnSpec, array: pa.Array, out: np.ndarray) -> None:
    _refuse_nulls(spec, array.null_count, "null lists")
    lengths = pc.fill_null(pc.list_value_length(array), spec.size).to_numpy(zero_copy_only=False)
    if (lengths != spec.size).any():
        raise FeatureError(
            f"feature column {spec.name!r} holds lists of "
            f"{lengths.min()} to {lengths.max()} values; the dataset's have "
            f"{spec.size}"
        )
    out[:] = 0.0
    valid = ~array.is_null().to_numpy(zero_copy_only=False)
    out[valid] = _list_values(spec, array).reshape(-1, spec.size)


def _encode_sequence(spec: ColumnSpec, array: pa.Array, out: np.ndarray) -> None:
    _refuse_nulls(spec, array.null_count, "null lists")
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
    values = _list_values(spec, array)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    positions = np.arange(len(values)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    kept = positions < spec.size
    out[:] = 0.0
    out[rows[kept], positions[kept]] = values[kept]
    out[:, spec.size :] = np.arange(spec.size) < np.minimum(lengths, spec.size)[:, None]


def category_codes(spec: ColumnSpec, array: pa.Array) -> np.ndarray:
    """Each row's slot: 1 + its index in the vocabulary (or its hash bucket); 0 when the
    value is null or outside the vocabulary."""
    strings = array.cast(pa.string())
    if spec.num_buckets:
        encoded = pc.dictionary_encode(strings)
        values = encoded.dictionary.to_pylist()
        hashed = (1 + zlib.crc32(value.encode()) % spec.num_buckets for value in values)
        buckets = np.array([0, *hashed], dtype=np.int64)
        # Nulls take the first entry (slot 0); value i the entry after it.
        indices = pc.fill_null(pc.add(encoded.indices.cast(pa.int64()), 1), 0)
        return buckets[indices.to_numpy(zero_copy_only=False)]
    index = pc.index_in(strings, value_set=pa.array(spec.vocabulary, pa.string()))
    return pc.fill_null(index, -1).to_numpy(zero_copy_only=False).astype(np.int64) + 1


def _encode_category(spec: ColumnSpec, array: pa.Array, out: np.ndarray) -> None:
    _refuse_nulls(spec, array.null_count)
    out[:] = 0.0
    out[np.arange(len(array)), category_codes(spec, array)] = 1.0


ENCODERS = {
    "numeric": _encode_scalar,
    "boolean": _encode_scalar,
    "temporal": _encode_scalar,
    "vector": _encode_vector,
    "sequence": _encode_sequence,
    "category": _encode_category,
}


def label_indices(labels: pa.ChunkedArray | pa.Array, classes: list[Any]) -> np.ndarray:
    """Each label's position in `classes` (the manifest's order), int64; a label that is
    not a class is an error naming it."""
    index = pc.index_in(labels, value_set=pa.array(list(classes)).cast(labels.type))
    if index.null_count:
        unknown = pc.unique(pc.filter(labels, pc.is_null(index))).to_pylist()[:5]
        raise FeatureError(f"label values {unknown} are not among the manifest classes")
    return index.to_numpy(zero_copy_only=False).astype(np.int64)
