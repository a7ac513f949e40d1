"""The feature codec on every column kind, its null policies, and the scan's profiles."""

from __future__ import annotations

import datetime as dt
import json
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec
from preprocessing.contract import numeric_block
from preprocessing.contract.codec import ENCODERS, FeatureCodec
from preprocessing.contract.column_spec import ColumnSpec, FeatureError, kind_of
from preprocessing.scan.feature_stats import (
    ColumnProfile,
    InputError,
    build_codec,
    merge_profiles,
    new_profiles,
    null_rows,
    profile_batch,
)


def codec_for(table: pa.Table, **settings: object) -> FeatureCodec:
    """The codec the reshard would build from `table` (every row a training row)."""
    spec = DatasetSpec(inputs=["unused"], feature_columns=table.column_names, **settings)
    profiles = new_profiles(table.schema, spec.feature_columns)
    for batch in table.to_batches():
        profile_batch(profiles, batch, np.ones(batch.num_rows, dtype=bool))
    files = {name: ["raw.parquet"] for name in spec.feature_columns}
    return build_codec(profiles, files, spec)


def test_scalars_of_every_width_become_one_standardized_vector() -> None:
    """Invariant: int8, uint16, int64, float32, float64 and decimal columns encode as one
    float32 matrix whose columns have mean 0 and standard deviation 1; booleans stay 0/1."""
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "a": pa.array(rng.integers(-100, 100, 500), pa.int8()),
            "b": pa.array(rng.integers(0, 60_000, 500), pa.uint16()),
            "c": pa.array(rng.integers(0, 10**12, 500), pa.int64()),
            "d": pa.array(rng.normal(5, 3, 500), pa.float32()),
            "e": pa.array(rng.normal(-1e6, 10, 500)),
            "f": pa.array([1.25, 2.5] * 250).cast(pa.decimal128(6, 2)),
            "g": pa.array(rng.random(500) < 0.3),
        }
    )
    matrix = codec_for(table).encode(table)
    assert matrix.dtype == np.float32 and matrix.shape == (500, 7)
    np.testing.assert_allclose(matrix[:, :6].mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(matrix[:, :6].std(axis=0), 1, atol=1e-4)
    assert np.array_equal(matrix[:, 6], table.column("g").to_numpy(zero_copy_only=False))
    unscaled = codec_for(table, standardize=False).encode(table)
    np.testing.assert_allclose(unscaled[:, 3], table.column("d").to_numpy(), rtol=1e-6)


def test_timestamps_and_dates_are_seconds_before_standardizing() -> None:
    """Invariant: a timestamp (any unit) and a date encode as seconds since the epoch."""
    days = [dt.date(1970, 1, 2), dt.date(2024, 3, 1)]
    table = pa.table(
        {"day": pa.array(days, pa.date32()), "at": pa.array([1_000, 2_500], pa.timestamp("ms"))}
    )
    matrix = codec_for(table, standardize=False).encode(table)
    assert matrix[:, 0].tolist() == [86_400.0, float((days[1] - dt.date(1970, 1, 1)).days * 86_400)]
    assert matrix[:, 1].tolist() == [1.0, 2.5]


def test_sequences_are_padded_or_truncated_with_a_mask() -> None:
    """Invariant: a variable-length list becomes `sequence_length` values (padded with 0,
    cut after that length) followed by as many mask values, 1 where an element is real."""
    table = pa.table({"tokens": pa.array([[5, 6], [7, 8, 9, 10, 11], []], pa.list_(pa.int32()))})
    matrix = codec_for(table, sequence_length=3).encode(table)
    assert matrix.tolist() == [[5, 6, 0, 1, 1, 0], [7, 8, 9, 1, 1, 1], [0, 0, 0, 0, 0, 0]]
    longest = codec_for(table)  # no sequence_length: the longest list the scan saw
    assert longest.columns[0].size == 5 and longest.width == 10


def test_fixed_size_lists_pass_through_and_other_lengths_are_refused() -> None:
    """Invariants: a fixed-size list of floats is its values (not standardized); rows of
    another length are refused naming the column."""
    values = pa.array(np.arange(6, dtype=np.float32))
    table = pa.table({"emb": pa.FixedSizeListArray.from_arrays(values, 3)})
    codec = codec_for(table)
    assert codec.encode(table).tolist() == [[0, 1, 2], [3, 4, 5]]
    wrong = pa.table({"emb": pa.array([[1.0, 2.0]], pa.list_(pa.float32()))})
    with pytest.raises(
        FeatureError, match="'emb' holds lists of 2 to 2 values; the dataset's have 3"
    ):
        codec.encode(wrong)


def test_strings_are_one_hot_over_the_vocabulary_and_unseen_values_take_slot_zero() -> None:
    """Invariants: each vocabulary value has its own slot; a value the scan never saw
    encodes as slot 0 (out of vocabulary), as does a null under a fill policy."""
    codec = codec_for(
        pa.table({"city": ["rome", "oslo", "rome", None]}), nulls={"city": "fill_zero"}
    )
    assert codec.columns[0].vocabulary == ["oslo", "rome"]
    rows = pa.table({"city": ["oslo", "atlantis", None, "rome"]})
    assert codec.encode(rows).tolist() == [[0, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 1]]


def test_too_many_categories_fail_naming_the_count_or_hash_when_asked() -> None:
    """Invariants: more distinct strings than max_categories is an error naming the column
    and its count; with category_buckets the values hash into stable buckets instead."""
    table = pa.table({"user": [f"u{i}" for i in range(40)]})
    with pytest.raises(
        InputError,
        match=r"'user' holds 40 distinct values, more than "
        r"dataset.max_categories=10",
    ):
        codec_for(table, max_categories=10)
    hashed = codec_for(table, max_categories=10, category_buckets=7)
    first, again = hashed.encode(table), hashed.encode(table.slice(5, 1))
    assert first.shape == (40, 8) and (first.sum(axis=1) == 1).all() and not first[:, 0].any()
    assert np.array_equal(first[5], again[0])


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("fill_zero", [[0.0], [-1.0], [1.0]]),  # the raw value 0, standardized: (0 - 2) / 2
        ("fill_mean", [[0.0], [0.0], [1.0]]),
        ("indicator", [[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]]),
    ],
)
def test_scalar_null_policies(policy: str, expected: list[list[float]]) -> None:
    """Invariant: fill_zero encodes a null as the raw value 0, fill_mean as the mean (0
    once standardized), indicator as the mean plus a 1 in the is-null slot."""
    profile_rows = pa.table({"x": pa.array([0.0, 4.0, None, float("nan")])})  # mean 2, std 2
    codec = codec_for(profile_rows, nulls={"x": policy})
    assert codec.columns[0].null_count == 2
    got = codec.encode(pa.table({"x": pa.array([2.0, None, 4.0])}))
    assert got.tolist() == expected


def test_a_null_under_error_or_drop_row_policy_is_refused_when_encoding() -> None:
    """Invariant: rows from outside the version with a null the policy does not fill are
    refused with the column's name, never encoded as some number."""
    codec = FeatureCodec((ColumnSpec("x", "numeric", "double", nulls="drop_row"),))
    with pytest.raises(FeatureError, match="'x' holds 1 nulls; its null policy is 'drop_row'"):
        codec.encode(pa.table({"x": pa.array([1.0, None])}))


def test_null_rows_marks_null_scalars_nan_and_lists_holding_a_null() -> None:
    """Invariant: the rows `drop_row` drops are those with a null, a NaN, a null list or a
    list holding a null element in any of the named columns."""
    table = pa.table(
        {
            "x": [1.0, float("nan"), 3.0, 4.0],
            "seq": pa.array([[1], [2], None, [None, 3]], pa.list_(pa.int64())),
        }
    )
    assert null_rows(table, ["x"]).tolist() == [False, True, False, False]
    assert null_rows(table, ["x", "seq"]).tolist() == [False, True, True, True]


def test_the_codec_round_trips_through_the_manifest_json() -> None:
    """Invariant: the codec's state is plain JSON and decodes to an equal codec."""
    codec = codec_for(pa.table({"x": [1.0, 2.0], "c": ["a", "b"]}))
    assert FeatureCodec.from_json(json.loads(json.dumps(codec.to_json()))) == codec
    assert codec.slices() == {"x": slice(0, 1), "c": slice(1, 4)}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=60),
    st.lists(st.integers(0, 60), max_size=4),
)
def test_profiles_merged_over_any_split_of_the_rows_equal_one_pass(
    values: list[float], cuts: list[int]
) -> None:
    """Property: per-file profiles merged give the mean and standard deviation of all the
    values, however the rows are split into files (the scan's per-file statistics)."""
    bounds = sorted({0, len(values), *(min(c, len(values)) for c in cuts)})
    parts = []
    for low, high in pairwise(bounds):
        profile = ColumnProfile("double", "numeric")
        profile.add_numbers(np.array(values[low:high]))
        parts.append({"x": profile})
    merged = merge_profiles(parts)["x"]
    assert merged.count == len(values)
    np.testing.assert_allclose(merged.mean, np.mean(values), rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(merged.std, np.std(values), rtol=1e-6, atol=1e-4)


def column_by_column(codec: FeatureCodec, table: pa.Table) -> np.ndarray:
    """The matrix as the codec's column path encodes it: one column at a time."""
    out = np.empty((table.num_rows, codec.width), dtype=np.float32)
    for spec, part in zip(codec.columns, codec.slices().values(), strict=True):
        ENCODERS[spec.kind](spec, table.column(spec.name).combine_chunks(), out[:, part])
    return out


def test_wide_numeric_blocks_encode_exactly_as_column_by_column(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: 600 numeric columns of six block types (nulls and NaN under each fill
    policy, two chunks, a block's rows in steps of 5) with categories and
    booleans between them encode to the same bytes through the blocks as one column at a
    time; a 64-bit integer column with a null, or past 2**53, takes the column path (the
    same bytes, the same refusal); a refused null names its column."""
    rng = np.random.default_rng(7)
    types = [pa.float64(), pa.float32(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64()]
    columns: dict[str, pa.Array] = {}
    monkeypatch.setattr(numeric_block, "STEP_BYTES", 4_096)  # 5 rows of 100 float64s a step
    for index in range(600):
        # Nulls in odd columns but the int64 ones: int64 as a block, uint64 column by column.
        mask = rng.random(300) < (0.05 if index % 2 and index % 6 != 3 else 0.0)
        values = np.abs(rng.normal(40, 15, 300))
        columns[f"n{index}"] = pa.array(values, mask=mask).cast(types[index % 6], safe=False)
        if index % 47 == 0:
            columns[f"s{index}"] = pa.array(rng.choice(["a", "b"], 300))
            columns[f"b{index}"] = pa.array(rng.random(300) < 0.5)
    columns["n0"] = pa.array(np.where(rng.random(300) < 0.1, np.nan, rng.random(300)))
    table = pa.table(columns)
    table = pa.concat_tables([table.slice(0, 120), table.slice(120)])
    policies = ("fill_mean", "indicator", "fill_zero")
    codec = FeatureCodec(
        tuple(
            ColumnSpec(
                name,
                kind_of(table.schema.field(name).type) or "",
                str(table.schema.field(name).type),
                shift=index / 7,
                scale=1 + index / 3,
                fill=index / 5,
                nulls=policies[index % 3] if name[0] == "n" else "fill_zero",
                vocabulary=["a"] if name[0] == "s" else [],
            )
            for index, name in enumerate(columns)
        )
    )
    assert np.array_equal(codec.encode(table), column_by_column(codec, table), equal_nan=True)
    big = pa.table({f"i{k}": pa.array([k, 2**60 if k == 70 else 1]) for k in range(100)})
    with pytest.raises(pa.ArrowInvalid, match="not in range"):
        FeatureCodec.from_schema(big.schema, big.column_names).encode(big)
    refused = pa.table({"x": pa.array([1.0, None, 3.0]), "y": pa.array([1.0, 2.0, 3.0])})
    with pytest.raises(FeatureError, match="'x' holds 1 nulls"):
        FeatureCodec.from_schema(refused.schema, ["x", "y"]).encode(refused)
