"""What one feature column is to the feature codec: its kind, its `ColumnSpec` (the codec's
JSON-able state of the column), and `FeatureError` for rows the codec cannot encode.

The kinds and what each becomes are described in preprocessing/contract/codec.py, which
encodes by these specs. Depends on the standard library and pyarrow only: it ships with
every logged model, as the codec does (tracking/run/model.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

SCALAR_KINDS = ("numeric", "boolean", "temporal")
FILL_POLICIES = ("fill_zero", "fill_mean", "indicator")


class FeatureError(ValueError):
    """Rows the codec cannot encode: a missing column, a null its policy refuses, a type
    or length that differs from the dataset's."""


@dataclass(frozen=True)
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
