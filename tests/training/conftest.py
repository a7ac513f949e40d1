"""Tiny generated datasets for training tests: shards written and committed through the
one path of every version writer (`preprocessing.contract.shards.write_shard`, then
`VersionAttempt.commit`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from preprocessing.contract.manifest import Manifest, SplitEntry, shard_name
from preprocessing.contract.shards import write_shard
from preprocessing.versions.attempt import VersionAttempt

# Label values differ from class indices, so the tests see the mapping work.
CLASS_VALUES = [10 * k + 3 for k in range(10)]


def make_table(ids: np.ndarray, dim: int, classes: list[int], rng: np.random.Generator) -> pa.Table:
    """Rows whose features are a class-specific mean plus noise, so a model can learn them."""
    labels = rng.integers(0, len(classes), len(ids))
    centres = np.random.default_rng(12345).normal(0, 1.0, (len(classes), dim))
    features = (centres[labels] + rng.normal(0, 0.5, (len(ids), dim))).astype(np.float32)
    flat = pa.array(features.ravel(), type=pa.float32())
    return pa.table(
        {
            "id": pa.array(ids, type=pa.int64()),
            "label": pa.array(np.asarray(classes)[labels], type=pa.int64()),
            "source": pa.array([f"s{i % 3}" for i in range(len(ids))]),
            "features": pa.FixedSizeListArray.from_arrays(flat, dim),
        }
    )


def write_split(
    attempt: VersionAttempt, split: str, table: pa.Table, shard_rows: list[int], row_group_size: int
) -> SplitEntry:
    """Write `table` as shards of the given sizes; the split's manifest entry."""
    entries, offset = [], 0
    for index, rows in enumerate(shard_rows):
        entries.append(
            write_shard(
                attempt.shard_uri(shard_name(split, index)),
                table.slice(offset, rows),
                row_group_size,
                "label",
                "source",
            )
        )
        offset += rows
    return SplitEntry(num_rows=offset, shards=entries)


def split_sizes(num_rows: int, num_shards: int) -> list[int]:
    """Uneven shard sizes (in ratio 1:2:3...) adding up to `num_rows`, none empty."""
    weights = np.arange(1, num_shards + 1)
    sizes = num_rows * weights // weights.sum()
    sizes[-1] += num_rows - sizes.sum()
    return [int(size) for size in sizes if size > 0]


def write_dataset(
    root: Path,
    num_rows: int,
    holdout_rows: int = 0,
    num_shards: int = 3,
    row_group_size: int = 16,
    dim: int = 16,
    seed: int = 0,
    validation_rows: int = 0,
) -> str:
    """A committed dataset version under `root` (train ids 0..N-1, holdout ids after, then
    validation ids)."""
    rng = np.random.default_rng(seed)
    version_id = f"test{num_rows}x{holdout_rows}x{num_shards}x{row_group_size}"
    version_id += f"x{validation_rows}" if validation_rows else ""
    with VersionAttempt(str(root), version_id) as attempt:
        train = make_table(np.arange(num_rows), dim, CLASS_VALUES, rng)
        splits = {
            "train": write_split(
                attempt, "train", train, split_sizes(num_rows, num_shards), row_group_size
            )
        }
        if holdout_rows:
            holdout = make_table(
                np.arange(num_rows, num_rows + holdout_rows), dim, CLASS_VALUES, rng
            )
            sizes = split_sizes(holdout_rows, 2)
            splits["holdout"] = write_split(attempt, "holdout", holdout, sizes, row_group_size)
        if validation_rows:
            first = num_rows + holdout_rows
            rows = make_table(np.arange(first, first + validation_rows), dim, CLASS_VALUES, rng)
            sizes = split_sizes(validation_rows, 2)
            splits["validation"] = write_split(attempt, "validation", rows, sizes, row_group_size)
        attempt.commit(dataset_manifest(version_id, train.schema, splits, seed))
    return str(root)


def dataset_manifest(
    version_id: str, schema: pa.Schema, splits: dict[str, SplitEntry], seed: int
) -> Manifest:
    return Manifest(
        version_id=version_id,
        label_column="label",
        source_column="source",
        id_column="id",
        feature_columns=["features"],
        classes=list(CLASS_VALUES),
        sources=["s0", "s1", "s2"],
        arrow_schema=[{"name": f.name, "type": str(f.type)} for f in schema],
        splits=splits,
        seed=seed,
        config={},
        input_fingerprint="test",
        input_class_counts={},
        input_source_counts={},
    )


@pytest.fixture(scope="session")
def dataset_cache(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """`dataset(num_rows, **options)`: root of a committed dataset, written once a session."""
    cache: dict[tuple, str] = {}

    def dataset(num_rows: int, **options: int) -> str:
        key = (num_rows, *sorted(options.items()))
        if key not in cache:
            cache[key] = write_dataset(tmp_path_factory.mktemp("dataset"), num_rows, **options)
        return cache[key]

    return dataset


@pytest.fixture
def make_dataset(tmp_path: Path) -> Callable[..., str]:
    """`make_dataset(num_rows, **options)`: a dataset of this test alone (it may damage it)."""
    return lambda num_rows, **options: write_dataset(tmp_path / "data", num_rows, **options)
