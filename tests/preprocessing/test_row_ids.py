"""Without `dataset.id_column` ballast derives row ids: a function of the file's path
relative to its input root and the row's index in it, unique, the same on every rerun and
cluster shape, carried to the shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.driver.cluster import DaskConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.plan.row_ids import DERIVED_ID_COLUMN, derived_ids, id_range


@settings(max_examples=60, deadline=None)
@given(
    path=st.text(min_size=1, max_size=80), num_rows=st.integers(1, 5_000), cut=st.integers(0, 5_000)
)
def test_derived_ids_depend_on_path_and_row_only(path, num_rows, cut) -> None:
    """Invariant: a file's ids are unique positive int64s inside its id range, and the same
    whichever row ranges (pieces) they are computed over."""
    cut = min(cut, num_rows)
    whole = derived_ids(path, 0, num_rows)
    parts = np.concatenate([derived_ids(path, 0, cut), derived_ids(path, cut, num_rows - cut)])
    assert np.array_equal(whole, parts) and len(np.unique(whole)) == num_rows
    low, high = id_range(path, num_rows)
    assert whole.dtype == np.int64 and 0 <= low == whole.min() and whole.max() == high


def write_files(raw: Path) -> dict[int, tuple[str, int]]:
    """Three Parquet files with no id column (one in a subdirectory); each row's unique
    `x` -> (path relative to `raw`, row index)."""
    rng = np.random.default_rng(4)
    where: dict[int, tuple[str, int]] = {}
    for number, name in enumerate(["a.parquet", "b.parquet", "sub/a.parquet"]):
        (raw / name).parent.mkdir(parents=True, exist_ok=True)
        x = np.arange(number * 1_000, number * 1_000 + 150 + 40 * number)
        pq.write_table(
            pa.table({"x": x, "label": rng.integers(0, 3, len(x))}), raw / name, row_group_size=64
        )
        where.update({int(v): (name, row) for row, v in enumerate(x)})
    return where


def version_rows(manifest_uri: str) -> dict[int, int]:
    """x -> derived id over every shard of both splits."""
    manifest, location = read_manifest(manifest_uri)
    assert manifest.id_column == DERIVED_ID_COLUMN
    tables = [
        pq.read_table(shard_uri(location, entry))
        for split in manifest.splits.values()
        for entry in split.shards
    ]
    table = pa.concat_tables(tables)
    ids = table.column(DERIVED_ID_COLUMN).to_pylist()
    assert len(set(ids)) == len(ids)  # natural mix, no resampling: each row once
    return dict(zip(table.column("x").to_pylist(), ids, strict=True))


@pytest.mark.slow
def test_a_table_without_ids_reshards_with_stable_unique_derived_ids(
    tmp_path, dask_client: Client
) -> None:
    """Invariants: without an id column every row gets a unique derived id equal to
    hash(path relative to the root) + row index; a rerun on a cluster of another shape
    (1 worker, pieces cut smaller), listing the same files through a `file://` URI, gives
    every row the same id."""
    where = write_files(tmp_path / "raw")
    settings = {"source_column": None, "feature_columns": ["x"]}

    def config(inputs: str, out: str, **shape: object) -> ReshardConfig:
        return ReshardConfig(
            dataset=DatasetSpec(inputs=[inputs], **settings),
            output_root=str(tmp_path / out),
            holdout_fraction=0.2,
            mix={"class_weighting": "natural"},
            target_shard_rows=100,
            **shape,
        )

    first = run_reshard(config(str(tmp_path / "raw"), "one"), dask_client)
    second = run_reshard(
        config(f"file://{tmp_path / 'raw'}", "two", max_piece_rows=50, exchange_task_bytes=1),
        DaskConfig(kind="local", num_workers=1),
    )
    ids = version_rows(first.manifest_uri)
    assert set(ids) == set(where)
    assert ids == {x: int(derived_ids(name, row, 1)[0]) for x, (name, row) in where.items()}
    assert version_rows(second.manifest_uri) == ids
