"""Row groups of one shard read by one call (training/data/shards.py `read_row_groups`,
training/data/readahead.py `Joined`) give exactly what a read of each gives: the same
Arrow columns and the same encoded rows for any schema and row-group layout, the same
values in the same order from the read-ahead, and a damaged page still named by its row
group."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.integrity import ShardDamaged
from preprocessing.contract.manifest import read_manifest
from tests.preprocessing.test_numeric_block import mixed_tables
from tests.training.test_damaged_shards import first_shard, flip_in_values
from training.data.readahead import Joined, ReadAhead
from training.data.shards import (
    Columns,
    ShardFiles,
    group_tables,
    leaf_indices,
    open_reader,
    read_layout,
    read_row_group,
    read_row_groups,
)


@st.composite
def layouts(draw: st.DrawFn) -> tuple[bytes, list[int], list[str], FeatureCodec]:
    """A Parquet file of hostile feature columns (numeric blocks of several types with
    nulls and NaN, columns too few for a block, a category with nulls, in any order) cut
    into row groups of a drawn size (1 row up; slices then start mid-byte of a validity
    bitmap), the row groups asked for (distinct, any order) and the names asked for."""
    table, codec = draw(mixed_tables())
    rows = draw(st.integers(1, 3)) * table.num_rows + draw(st.integers(0, 2))
    table = pa.concat_tables([table] * (-(-rows // table.num_rows))).slice(0, rows)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=draw(st.integers(1, 7)))
    data = sink.getvalue().to_pybytes()
    count = pq.ParquetFile(pa.BufferReader(data)).num_row_groups
    groups = draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=count, unique=True))
    names = draw(st.permutations(table.column_names))
    return data, groups, list(names), codec


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_a_joined_read_cut_back_equals_each_row_groups_read(
    case: tuple[bytes, list[int], list[str], FeatureCodec],
) -> None:
    """Invariant: for any schema, row-group layout and row groups asked for in any order,
    one read of them cut back by their row counts gives, group by group, the table
    pq.ParquetFile.read_row_group(columns=names) gives, and the codec encodes the same
    bytes from it."""
    data, groups, names, codec = case
    reader = open_reader(pa.BufferReader(data), None)
    sizes = np.array([reader.metadata.row_group(g).num_rows for g in groups], np.int64)
    joined = reader.read_row_groups(
        groups, column_indices=leaf_indices(reader, names), use_threads=True
    )
    for group, part in zip(groups, group_tables(joined, sizes), strict=True):
        alone = pq.ParquetFile(pa.BufferReader(data)).read_row_group(group, columns=names)
        # repr: a NaN equals a NaN there (not in Table.equals), and a null stays apart.
        assert part.schema.equals(alone.schema)
        assert repr(part.to_pylist()) == repr(alone.to_pylist())
        assert codec.encode(part).tobytes() == codec.encode(alone).tobytes()


def split_reader(root: str) -> tuple[Columns, ShardFiles, list[list[int]]]:
    """The train split's columns, shard files and each shard's row groups (layout order)."""
    manifest, location = read_manifest(root)
    columns = Columns.from_manifest(manifest)
    layout = read_layout(manifest, location, "train", columns)
    shards = [np.flatnonzero(layout.group_shard == k).tolist() for k in range(len(layout.entries))]
    return columns, ShardFiles(layout), shards


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(20, 90), st.sampled_from([3, 7, 16]), st.randoms(use_true_random=False))
def test_read_row_groups_decodes_what_reads_of_one_decode(
    dataset_cache: Callable[..., str], num_rows: int, row_group_size: int, random: object
) -> None:
    """Invariant: for any shard layout and any of a shard's row groups in any order,
    `read_row_groups` gives each group's features, labels and ids as `read_row_group`
    gives them."""
    root = dataset_cache(num_rows, num_shards=2, row_group_size=row_group_size)
    columns, files, shards = split_reader(root)
    for groups in shards:
        asked = random.sample(groups, random.randint(1, len(groups)))  # type: ignore[attr-defined]
        joined = read_row_groups(files.layout, asked, columns, files)
        for group, rows in zip(asked, joined, strict=True):
            alone = read_row_group(files.layout, group, columns, files)
            assert rows.features.tobytes() == alone.features.tobytes()
            assert np.array_equal(rows.label, alone.label) and np.array_equal(rows.id, alone.id)


@pytest.mark.parametrize("asked", [[0, 1, 2, 3], [3, 1], [1]])
def test_a_damaged_page_in_a_joined_read_names_its_row_group(
    make_dataset: Callable[..., str], asked: list[int]
) -> None:
    """Flipped bytes in row group 1 of a shard, read with other groups of that shard by
    one call, raise ShardDamaged naming the shard and row group 1, not another group."""
    root = make_dataset(192, num_shards=2, row_group_size=16)  # 4 groups in shard 0
    entry, path, _ = first_shard(root)
    flip_in_values(Path(path), group=1)
    columns, files, shards = split_reader(root)
    with pytest.raises(ShardDamaged, match=r"row group 1\b") as raised:
        read_row_groups(files.layout, [shards[0][g] for g in asked], columns, files)
    assert entry.path in str(raised.value)


@st.composite
def key_plans(draw: st.DrawFn) -> tuple[list[int | None], int, int]:
    """A key sequence as the loader plans one: each slot once, in any order, and None (no
    key known yet) after a key where drawn; a depth, and the modulus of the join rule
    (keys equal mod it may join)."""
    slots = draw(st.lists(st.integers(0, 60), max_size=40, unique=True))
    pauses = draw(st.lists(st.booleans(), min_size=len(slots), max_size=len(slots)))
    keys = [
        item
        for key, pause in zip(slots, pauses, strict=True)
        for item in ([key, None] if pause else [key])
    ]
    return keys, draw(st.integers(1, 5)), draw(st.integers(1, 3))


@settings(max_examples=200, deadline=None)
@given(key_plans())
def test_joined_read_ahead_gives_what_reads_of_one_key_give(
    plan: tuple[list[int | None], int, int],
) -> None:
    """Invariant: for any key sequence, depth and join rule, a read-ahead that joins keys
    gives each key its own value in the planned order, as one without joins does; a
    joined call takes only keys the rule accepts, at most `depth` of them; and keys do
    join wherever the rule and the depth let two."""
    keys, depth, modulus = plan
    calls: list[list[int]] = []

    def load_joined(batch: list[int]) -> list[str]:
        calls.append(batch)
        return [f"value {key}" for key in batch]

    def accepts(batch: list[int], key: int) -> bool:
        return key % modulus == batch[0] % modulus and key not in batch

    asked = [key for key in keys if key is not None]
    with ReadAhead(lambda key: f"value {key}", keys, depth) as alone:
        expected = [alone.get(key) for key in asked]
    with ReadAhead(lambda key: f"value {key}", keys, depth, Joined(accepts, load_joined)) as reads:
        assert [reads.get(key) for key in asked] == expected == [f"value {k}" for k in asked]
    for batch in calls:
        assert 1 < len(batch) <= depth and all(accepts(batch[:1], key) for key in batch[1:])
    if depth > 1 and modulus == 1 and keys[:2] == [0, 1]:
        assert calls and calls[0][:2] == [0, 1]
