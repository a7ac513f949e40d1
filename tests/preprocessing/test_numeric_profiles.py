"""The scan's statistics of numeric columns taken as blocks (preprocessing/scan/
numeric_profiles.py) are bit for bit those of the column path, over hostile values: the
manifest's means, deviations, null counts and sketches, hence the codec and the version,
do not change with the way the scan computes them."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from preprocessing.scan import numeric_profiles
from preprocessing.scan.feature_stats import ColumnProfile, new_profiles, profile_batch

TYPES = {
    "float32": (pa.float32(), st.floats(width=32)),
    "float64": (pa.float64(), st.floats(allow_subnormal=True)),
    "int8": (pa.int8(), st.integers(-128, 127)),
    "uint32": (pa.uint32(), st.integers(0, 2**32 - 1)),
    "int64": (pa.int64(), st.integers(-(2**53), 2**53) | st.integers(-(2**63), 2**63 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2**64 - 1)),
}
SPECIAL = [0.0, -0.0, 1e308, -1e308, float("inf"), float("-inf"), float("nan"), 3.4e38]


@st.composite
def column(draw: st.DrawFn, type_name: str, rows: int) -> pa.Array:
    """A column of `rows` hostile values: nulls, NaN, infinities, -0.0, huge numbers, all
    null or constant."""
    arrow_type, values = TYPES[type_name]
    if type_name.startswith("float"):
        values = values | st.sampled_from(SPECIAL)
    shape = draw(st.sampled_from(["mixed", "constant", "all null", "no null"]))
    if shape == "all null":
        return pa.nulls(rows, arrow_type)
    if shape == "constant":
        return pa.array([draw(values)] * rows, arrow_type)
    cell = values if shape == "no null" else values | st.none()
    return pa.array(draw(st.lists(cell, min_size=rows, max_size=rows)), arrow_type)


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[pa.RecordBatch], list[np.ndarray]]:
    """Two batches of the same schema: blocks of one to three types (some narrower than a
    block), each with the rows the scan keeps."""
    names = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=3, unique=True))
    widths = [draw(st.integers(1, numeric_profiles.MIN_BLOCK_COLUMNS + 4)) for _ in names]
    found, kept = [], []
    for _ in range(2):
        rows = draw(st.integers(0, 40))
        columns = {
            f"{name}_{index}": draw(column(name, rows))
            for name, width in zip(names, widths, strict=True)
            for index in range(width)
        }
        found.append(pa.record_batch(columns))
        kept.append(np.array(draw(st.lists(st.booleans(), min_size=rows, max_size=rows)), bool))
    return found, kept


def folded(batches: list[pa.RecordBatch], kept: list[np.ndarray], alone: bool) -> Any:
    """The profiles of the batches' columns, by the scan (`alone`: each column in a batch
    of its own, so on the column path), or the error it raised."""
    profiles = new_profiles(batches[0].schema, batches[0].schema.names)
    try:
        for batch, rows in zip(batches, kept, strict=True):
            parts = [batch.select([name]) for name in batch.schema.names] if alone else [batch]
            for part in parts:
                profile_batch(profiles, part, rows)
    except Exception as error:  # a 64-bit integer past 2**53: both paths refuse it
        return type(error)
    return {name: exact(profile) for name, profile in profiles.items()}


def exact(profile: ColumnProfile) -> tuple[Any, ...]:
    """A profile with each float as its bits: -0.0 and NaN compare as what they are."""
    bits = [struct.pack("<d", value) for value in (profile.mean, profile.m2)]
    return (profile.null_rows, profile.count, *bits, profile.hashes.tobytes(), profile.values)


HUGE_INT64 = (
    [pa.record_batch({f"i{k}": pa.array([2**60 + k, 1], pa.int64()) for k in range(8)})],
    [np.ones(2, bool)],
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
@example(HUGE_INT64)
def test_blocks_give_the_column_paths_statistics_bit_for_bit(
    case: tuple[list[pa.RecordBatch], list[np.ndarray]],
) -> None:
    """Invariant: for any numeric columns (NaN, nulls, infinities, -0.0, huge values, all
    null, constant, integers and floats of several widths in one table, any kept rows),
    the profiles the scan folds with its blocks equal, bit for bit, those of each column
    profiled alone: null rows, count, mean, squared deviations, distinct-value sketch (or
    the same refusal, for a 64-bit integer float64 cannot hold)."""
    found, kept = case
    assert folded(found, kept, alone=False) == folded(found, kept, alone=True)


def test_long_columns_sum_alike_in_a_block_and_alone() -> None:
    """Invariant: on 70,000 rows (past numpy's pairwise-summation blocks) of values that
    differ by orders of magnitude, a block's mean and squared deviations equal the
    column path's bit for bit."""
    rng = np.random.default_rng(7)
    values = rng.lognormal(0, 6, size=(12, 70_000)) * rng.choice([-1, 1], size=(12, 70_000))
    batch = pa.record_batch({f"x{k}": values[k] for k in range(12)})
    kept = rng.random(70_000) < 0.9
    assert folded([batch], [kept], alone=False) == folded([batch], [kept], alone=True)


def test_a_wide_batch_is_folded_in_blocks_not_column_by_column() -> None:
    """Invariant: the block path is the one taken for a wide float table (so the property
    above tests the code the scan runs): every column's profile is folded by one block."""
    batch = pa.record_batch({f"x{k}": np.arange(5.0) + k for k in range(64)})
    profiles = new_profiles(batch.schema, batch.schema.names)
    blocks = numeric_profiles.numeric_blocks(profiles, batch.schema, batch.schema.names)
    assert blocks == [batch.schema.names]
    assert numeric_profiles.fold_block(profiles, batch, blocks[0], np.ones(5, bool))
    assert [profile.mean for profile in profiles.values()] == [2.0 + k for k in range(64)]
