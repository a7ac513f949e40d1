"""The codec's numeric blocks (preprocessing/contract/numeric_block.py) write the same bytes
as its column path over hostile values, on the path a plain wide table takes (one run of
slots, no indicator: standardized straight into the float32 matrix) and on the one a NaN
sends a block to."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preprocessing.contract import numeric_block
from preprocessing.contract.codec import ENCODERS, FeatureCodec
from preprocessing.contract.column_spec import ColumnSpec

SPECIAL = [0.0, -0.0, 1e308, -1e308, 3.4e38, -3.4e38, float("inf"), float("-inf"), 1e-310]
TYPES = {"float32": pa.float32(), "float64": pa.float64(), "int32": pa.int32()}


@st.composite
def wide_tables(draw: st.DrawFn) -> tuple[pa.Table, FeatureCodec]:
    """A block's worth of numeric columns of one type, hostile values (NaN only where
    drawn), fill policies that take nulls, and shifts and scales of any magnitude."""
    type_name = draw(st.sampled_from(sorted(TYPES)))
    rows = draw(st.integers(1, 12))
    nan = draw(st.booleans())
    cell = (
        st.integers(-(2**31), 2**31 - 1)
        if type_name == "int32"
        else st.floats(width=32 if type_name == "float32" else 64, allow_nan=nan)
        | st.sampled_from(SPECIAL)
    )
    width = numeric_block.MIN_BLOCK_COLUMNS + draw(st.integers(0, 3))
    values = draw(st.lists(cell, min_size=rows * width, max_size=rows * width))
    table = pa.table(
        {
            f"x{k}": pa.array(values[k * rows : (k + 1) * rows], TYPES[type_name])
            for k in range(width)
        }
    )
    scale = st.floats(1e-300, 1e300) | st.sampled_from([1.0, 3.0])
    specs = tuple(
        ColumnSpec(
            name,
            "numeric",
            str(TYPES[type_name]),
            shift=draw(st.floats(-1e300, 1e300) | st.just(0.0)),
            scale=draw(scale),
            fill=1.5,
            nulls="fill_mean",
        )
        for name in table.column_names
    )
    return table, FeatureCodec(specs)


def column_by_column(codec: FeatureCodec, table: pa.Table) -> np.ndarray:
    out = np.empty((table.num_rows, codec.width), dtype=np.float32)
    for spec, part in zip(codec.columns, codec.slices().values(), strict=True):
        ENCODERS[spec.kind](spec, table.column(spec.name).combine_chunks(), out[:, part])
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wide_tables())
def test_blocks_encode_the_column_paths_bytes(case: tuple[pa.Table, FeatureCodec]) -> None:
    """Invariant: for any wide numeric table (infinities, -0.0, subnormals, float32's
    largest values, whose sum overflows, NaN or none; any shift and scale), the codec's
    blocks write the column path's bytes, and do take the block path."""
    table, codec = case
    blocks, rest = codec._plan(table.schema)
    assert len(blocks) == 1 and not rest
    encoded, expected = codec.encode(table), column_by_column(codec, table)
    assert encoded.tobytes() == expected.tobytes()


BLOCK_TYPES = {
    "float32": pa.float32(),
    "float64": pa.float64(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "int8": pa.int8(),
}


@st.composite
def mixed_tables(draw: st.DrawFn) -> tuple[pa.Table, FeatureCodec]:
    """Feature columns of several numeric types (blocks and columns too few for one),
    nulls and NaN under `fill_mean` or `indicator`, a category column among them, other
    columns between them, and the table's column order unrelated to the codec's."""
    rows = draw(st.integers(1, 6))
    counts = {
        name: draw(st.sampled_from([0, 3, numeric_block.MIN_BLOCK_COLUMNS])) for name in BLOCK_TYPES
    }
    columns, specs = {}, []
    for type_name, count in counts.items():
        for k in range(count):
            name = f"{type_name}_{k}"
            cell = st.integers(-100, 100) | st.none()
            if type_name.startswith("float"):
                cell = st.floats(-1e6, 1e6) | st.just(float("nan")) | st.none()
            columns[name] = pa.array(
                draw(st.lists(cell, min_size=rows, max_size=rows)), BLOCK_TYPES[type_name]
            )
            nulls = draw(st.sampled_from(["fill_mean", "indicator"]))
            shift, scale = draw(st.floats(-10, 10)), draw(st.floats(0.5, 4))
            specs.append(
                ColumnSpec(
                    name, "numeric", type_name, shift=shift, scale=scale, fill=0.25, nulls=nulls
                )
            )
    columns["word"] = pa.array(
        draw(st.lists(st.sampled_from(["a", "b", None]), min_size=rows, max_size=rows))
    )
    specs.append(ColumnSpec("word", "category", "string", nulls="fill_zero", vocabulary=["a", "b"]))
    columns["id"] = pa.array(range(rows), pa.int64())
    order = draw(st.permutations(sorted(columns)))
    codec_order = draw(st.permutations(specs))
    return pa.table({name: columns[name] for name in order}), FeatureCodec(tuple(codec_order))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_tables(), st.randoms(use_true_random=False))
def test_a_plan_by_schema_index_encodes_the_column_paths_bytes(
    case: tuple[pa.Table, FeatureCodec], random: Any
) -> None:
    """Invariant: blocks pick their columns by index in the schema they were planned for;
    for any mix of types, nulls, indicators and column orders, the codec writes the column
    path's bytes, and a table of the same columns in another order (the plan kept for the
    last schema must not be reused) too."""
    table, codec = case
    assert codec.encode(table).tobytes() == column_by_column(codec, table).tobytes()
    names = table.column_names
    random.shuffle(names)
    moved = table.select(names)
    assert codec.encode(moved).tobytes() == column_by_column(codec, moved).tobytes()


def test_a_feature_column_held_twice_is_refused_by_name() -> None:
    """Invariant: rows holding a feature column twice are refused, naming it, not encoded
    from either copy."""
    width = numeric_block.MIN_BLOCK_COLUMNS
    specs = tuple(ColumnSpec(f"x{k}", "numeric", "double") for k in range(width))
    arrays = [pa.array([1.0])] * (width + 1)
    table = pa.Table.from_arrays(arrays, names=[*(spec.name for spec in specs), "x3"])
    with pytest.raises(KeyError, match="x3"):
        FeatureCodec(specs).encode(table)
