"""Shard bytes are pinned: the exchange's stages run in this process (scan, plan, map, merge
rounds, write; no Dask) on small files with a holdout, nulls filled and both kinds of ids,
and every shard's sha256 is the one the code before the staged-read and shard-write changes
of issue 25 wrote (commit 3dc5cc3), so a change of how rows are read, decoded or written
that alters a byte of a shard fails here, without a cluster."""

from __future__ import annotations

import hashlib
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver import reshard
from preprocessing.exchange import shard_slices
from preprocessing.exchange import tasks as exchange
from preprocessing.scan.across_files import check_schemas
from preprocessing.scan.inputs import scan_file
from preprocessing.storage.sources import list_inputs

# sha256 of the shards' sha256s joined, in destination order, as manifest format 3 writes
# them (vectors stored as Delta Lake's list, contract/shards.py: stored_schema; before it,
# commit 3dc5cc3 wrote cb7033a3... and 93c2fb47..., the same rows as fixed-size lists).
# Re-pinned once when the scan's schema got one form (storage/schema_form.py): a reshard
# on Dask worker processes, whose scans come back pickled, has always written these
# bytes (the commit before it gives the same shards on worker processes); this test's
# in-process path alone had named the vector's child `element` (8f71b39e... and
# cd55fd46...), a form no reshard on workers wrote.
PINNED = {
    "id": "117a3e7bdd036266ecb36c5c9db541111519fbb7054a835f7a235e7d8c8b8025",
    None: "416a84968b35e4fee5b393ef39efbaf4fb031614ceff6210eb09571ef2857e6d",
}


@pytest.fixture(scope="module")
def small_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 files of 150-440 rows, one or several row groups, a nullable float feature."""
    directory = tmp_path_factory.mktemp("pinned-raw")
    rng = np.random.default_rng(7)
    for index in range(30):
        rows = 150 + 10 * index
        features = rng.standard_normal(4 * rows, dtype=np.float32)
        x, missing = rng.normal(size=rows), rng.random(rows) < 0.1  # drawn before the labels
        table = pa.table(
            {
                "id": pa.array(np.arange(rows) + 1000 * index, pa.int64()),
                "label": pa.array(rng.choice(["a", "b", "c"], rows, p=[0.6, 0.3, 0.1])),
                "source": pa.array([f"s{index % 2}"] * rows),
                "features": pa.FixedSizeListArray.from_arrays(pa.array(features), 4),
                "x": pa.array(x, mask=missing),
            }
        )
        pq.write_table(
            table,
            directory / f"part-{index:03d}.parquet",
            row_group_size=200 if index % 3 else rows,
        )
    return directory


def shard_digests(inputs: Path, output: Path, id_column: str | None) -> list[str]:
    """Every shard's sha256, the exchange run stage by stage in this process."""
    config = ReshardConfig(
        dataset=DatasetSpec(
            inputs=[str(inputs)],
            id_column=id_column,
            feature_columns=["features", "x"],
            nulls={"x": "fill_mean"},
        ),
        output_root=str(output),
        target_shard_rows=400,
        rows_per_row_group=128,
        holdout_fraction=0.2,
        exchange_task_bytes=60_000,
        exchange_fan_in=2,
        seed=3,
    )
    scans = check_schemas(
        [
            scan_file(
                file, config.dataset, config.seed, config.holdout_fraction, config.max_piece_rows
            )
            for file in list_inputs(config.dataset)
        ]
    )
    schema = reshard._output_schema(scans, config)
    plans, pieces = reshard._plan(scans, config)
    destinations = exchange.destinations_for(plans, schema)
    layout = exchange.exchange_layout(scans, plans, pieces, config, threads=1)
    assert len(layout.rounds) > 1  # merge rounds run too
    staging = exchange.Staging(str(output / "exchange"), layout, destinations.schema)
    first_rows = exchange.piece_rows(scans, pieces)[0]
    for task in range(layout.num_map_tasks):
        exchange.map_pieces(
            exchange.map_task(scans, plans, pieces, first_rows, staging, task),
            destinations,
            config.dataset,
            config.seed,
            config.holdout_fraction,
        )
    for round_index in range(1, len(layout.rounds)):
        for task in range(layout.rounds[round_index].num_objects):
            exchange.merge_task(round_index, task, staging)
    shards = exchange.shard_jobs(plans, lambda name: f"{output}/shards/{name}")
    return [
        entry.sha256
        for first, stop in pairwise(layout.write_bounds.tolist())
        for entry in exchange.write_shards(
            first, shards[first:stop], staging, schema, config.dataset, config.rows_per_row_group
        )
    ]


@pytest.mark.parametrize(
    ("run_bytes", "slice_bytes"),
    [(0, shard_slices.SLICE_BYTES), (0, 1), (exchange.ORDER_RUN_BYTES, shard_slices.SLICE_BYTES)],
)
@pytest.mark.parametrize("id_column", ["id", None])
def test_shards_keep_the_bytes_of_before(
    small_files: Path,
    tmp_path: Path,
    id_column: str | None,
    run_bytes: int,
    slice_bytes: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: with an id column or derived ids, the 23 shards (train and holdout) are
    byte-identical to those commit 3dc5cc3 wrote for the same inputs and settings, whether
    each shard is put in order alone (run_bytes 0, as a large shard is) and taken in one
    slice or a row group at a time (slice_bytes 1), or with the others of a run (one
    take)."""
    monkeypatch.setattr(exchange, "ORDER_RUN_BYTES", run_bytes)
    monkeypatch.setattr(shard_slices, "SLICE_BYTES", slice_bytes)
    digests = shard_digests(small_files, tmp_path, id_column)
    assert len(digests) == 23
    assert hashlib.sha256("".join(digests).encode()).hexdigest() == PINNED[id_column]


@given(sizes=st.lists(st.integers(0, 5_000), max_size=30), limit=st.integers(0, 12_000))
@settings(max_examples=200, deadline=None)
def test_order_runs_cover_the_shards_in_order_within_the_bytes(
    sizes: list[int], limit: int
) -> None:
    """Invariant: the runs are consecutive, cover every shard once in order, and each holds
    at most ORDER_RUN_BYTES, or a single shard."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(exchange, "ORDER_RUN_BYTES", limit)
        runs = exchange.order_runs(sizes)
    assert [i for start, stop in runs for i in range(start, stop)] == list(range(len(sizes)))
    assert all(stop > start for start, stop in runs)
    assert all(stop - start == 1 or sum(sizes[start:stop]) <= limit for start, stop in runs)
