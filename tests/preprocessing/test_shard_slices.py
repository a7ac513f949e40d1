"""A shard written a slice at a time from its blocks (exchange/shard_slices.py) has the
bytes and the entry of the same rows taken whole and written at once, whatever the
blocks, the order, the row groups and the slice size."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.contract.shards import write_shard
from preprocessing.exchange import shard_slices
from preprocessing.exchange.shard_slices import Blocks, keyed_slices

OUTPUT = pa.schema(
    [
        ("id", pa.int64()),
        ("label", pa.dictionary(pa.int32(), pa.string())),
        ("note", pa.string()),
        ("x", pa.list_(pa.float32(), 3)),
    ]
)


def rows_of(count: int, seed: int) -> pa.Table:
    """`count` rows with nulls, repeated labels, strings and a vector column."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(["a", "b", "ccc", "é"], count).tolist()
    notes = [None if rng.random() < 0.2 else "n" * int(rng.integers(0, 5)) for _ in range(count)]
    vectors = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.standard_normal(3 * count).astype(np.float32)), 3
    )
    return pa.table(
        {
            "id": pa.array(np.arange(count) * 7 - 3),
            "label": pa.array(labels),
            "note": pa.array(notes, pa.string()),
            "x": vectors,
        }
    )


@settings(max_examples=30, deadline=None)
@given(
    count=st.integers(0, 300),
    cuts=st.lists(st.integers(0, 300), max_size=6),
    row_group=st.sampled_from([5, 64, 1_000]),
    slice_bytes=st.sampled_from([1, 500, 4_000, shard_slices.SLICE_BYTES]),
    seed=st.integers(0, 2**16),
)
def test_a_shard_written_in_slices_has_the_bytes_of_one_written_whole(
    count: int, cuts: list[int], row_group: int, slice_bytes: int, seed: int
) -> None:
    """Invariant: the shard of rows `picks` of blocks cut anywhere, taken and cast a slice
    at a time, is byte for byte (and entry for entry) the shard of the same rows taken
    whole, cast and written at once."""
    table = rows_of(count, seed)
    bounds = sorted({0, count, *(cut for cut in cuts if cut <= count)})
    batches = [b for a, z in pairwise(bounds) for b in table.slice(a, z - a).to_batches()]
    picks = np.random.default_rng(seed).permutation(count)
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as directory:
        patch.setattr(shard_slices, "SLICE_BYTES", slice_bytes)
        whole = write_shard(
            f"{directory}/whole.parquet", table.take(picks).cast(OUTPUT), row_group, "label"
        )
        sliced = write_shard(
            f"{directory}/sliced.parquet",
            keyed_slices(Blocks.of(batches, table.schema), picks, OUTPUT, row_group),
            row_group,
            "label",
        )
        same = (
            Path(directory, "whole.parquet").read_bytes()
            == Path(directory, "sliced.parquet").read_bytes()
        )
    assert same
    assert replace(sliced, path="") == replace(whole, path="")
