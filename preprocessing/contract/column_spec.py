"""What one feature column is to the feature codec: its kind, its `ColumnSpec` (the codec's
JSON-able state of the column), `FeatureError` for rows the codec cannot encode, and how
ISO 8601 strings read as timestamps (`parse_timestamps`: the codec's date columns, `ballast
init`'s survey and a time holdout's column read them alike).

The kinds and what each becomes are described in preprocessing/contract/codec.py, which
encodes by these specs. Depends on the standard library and pyarrow only: it ships with
every logged model, as the codec does (tracking/run/model.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

SCALAR_KINDS = ("numeric", "boolean", "temporal")
FILL_POLICIES = ("fill_zero", "fill_mean", "indicator")


class FeatureError(ValueError):
    """Rows the codec cannot encode: a missing column, a null its policy refuses, a type
    or length that differs from the dataset's."""


@dataclass(frozen=True, slots=True)  # slots: no dict per spec, 5,000 objects fewer to collect
class ColumnSpec:
    """How one feature column becomes model inputs (see preprocessing/contract/codec.py)."""

    name: str
    kind: str
    arrow_type: str
    size: int = 1  # vector: values per list; sequence: the padded length
    shift: float = 0.0
    scale: float = 1.0
    fill: float = 0.0  # the raw value put in place of a null under a fill policy
    nulls: str = "error"
    null_count: int = 0  # nulls the scan found in the inputs (a record, not used to encode)
    vocabulary: list[str] = field(default_factory=list)
    num_buckets: int = 0

    @property
    def width(self) -> int:
        """Floats this column contributes to a row of the matrix."""
        if self.kind in SCALAR_KINDS:
            return 2 if self.nulls == "indicator" else 1
        if self.kind == "vector":
            return self.size
        if self.kind == "sequence":
            return 2 * self.size
        return 1 + (self.num_buckets or len(self.vocabulary))


def kind_of(arrow_type: pa.DataType) -> str | None:
    """The codec kind of an Arrow type, or None when no kind encodes it."""
    if pa.types.is_dictionary(arrow_type):
        return kind_of(arrow_type.value_type)
    if pa.types.is_boolean(arrow_type):
        return "boolean"
    if (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_decimal(arrow_type)
    ):
        return "numeric"
    if pa.types.is_temporal(arrow_type):
        return "temporal"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "category"
    if (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    ):
        element = kind_of(arrow_type.value_type)
        if element in ("numeric", "boolean"):
            return "vector" if pa.types.is_fixed_size_list(arrow_type) else "sequence"
    return None


_ZONE_SUFFIX = r"(Z|[+-]\d\d:?\d\d)$"  # an ISO 8601 timestamp's zone: `Z` or `+01:00`


def parse_timestamps(strings: pa.Array) -> pa.Array:
    """ISO 8601 dates or timestamps (`2024-03-01`, `2024-03-01 12:30:00`, with `T`, a
    fraction, `Z` or an offset; without a zone, UTC) as timestamp[us, UTC]; `FeatureError`
    naming the first string that is none of these."""
    try:
        return _parsed(strings)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    for value in strings.to_pylist():  # the slow path only to name the culprit
        try:
            _parsed(pa.array([value], pa.string()))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise FeatureError(
                f"{value!r} is not an ISO 8601 date or timestamp (a column of dataset.date_columns)"
            ) from None
    raise FeatureError("dates that do not parse as ISO 8601 (a column of dataset.date_columns)")


def _parsed(strings: pa.Array) -> pa.Array:
    # Arrow parses an offset only into a zoned type and a string without one only into a
    # naive type: each part apart, the naive one read as UTC.
    strings = strings.cast(pa.string())
    zoned = pc.match_substring_regex(strings, _ZONE_SUFFIX)
    with_zone = pc.if_else(zoned, strings, None).cast(pa.timestamp("us", tz="UTC"))
    without = pc.if_else(zoned, None, strings).cast(pa.timestamp("us"))
    micros = pc.if_else(zoned, with_zone.cast(pa.int64()), without.cast(pa.int64()))
    return micros.cast(pa.timestamp("us", tz="UTC"))
