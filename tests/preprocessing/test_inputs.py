"""Raw inputs of every format, cut into bounded pieces; bad files rejected with reasons."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.scan.columns import IdTally
from preprocessing.scan.row_counts import _distinct_counts
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import read_rows


def flat_table(first_id: int, num_rows: int, seed: int) -> pa.Table:
    """Scalar columns only, as CSV and JSON Lines carry them."""
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": np.arange(first_id, first_id + num_rows),
            "label": rng.choice(3, num_rows, p=[0.7, 0.2, 0.1]),
            "source": ["web"] * num_rows,
            "f0": rng.normal(size=num_rows),
            "f1": rng.normal(size=num_rows),
        }
    )


def flat_spec(inputs: Path) -> DatasetSpec:
    return DatasetSpec(inputs=[str(inputs)], feature_columns=["f0", "f1"])


@pytest.mark.slow
def test_csv_and_jsonl_inputs_reshard_and_a_non_numeric_label_is_rejected(
    tmp_path, dask_client
) -> None:
    """Invariants: CSV and JSON Lines files are read; a CSV whose label column is not numeric
    is rejected with a reason naming the column; every good row is accounted for."""
    raw = tmp_path / "raw"
    raw.mkdir()
    pa_csv.write_csv(flat_table(0, 400, 1), raw / "a.csv")
    pa_csv.write_csv(flat_table(400, 300, 2), raw / "b.csv")
    flat_table(700, 200, 3).to_pandas().to_json(raw / "c.jsonl", orient="records", lines=True)
    bad = flat_table(900, 50, 4).set_column(1, "label", pa.array(["cat"] * 50))
    pa_csv.write_csv(bad, raw / "d.csv")
    config = ReshardConfig(
        dataset=flat_spec(raw),
        output_root=str(tmp_path / "out"),
        target_shard_rows=250,
        max_rejected_fraction=0.3,
        holdout_fraction=0.0,
        mix={"class_weighting": "natural"},
    )
    manifest = run_reshard(config, dask_client).manifest
    (rejected,) = manifest.rejected
    assert rejected.path.endswith("d.csv") and "'label'" in rejected.reason
    assert manifest.split("train").num_rows == 900


@pytest.mark.slow
def test_pieces_smaller_than_row_groups_change_nothing_in_the_output(tmp_path, dask_client) -> None:
    """Invariant: cutting one big row group into many pieces (bounded task memory) gives
    byte-identical shards in global mode; every task held at most max_piece_rows rows."""
    raw = tmp_path / "raw"
    raw.mkdir()
    table = flat_table(0, 5_000, 7)
    pq.write_table(table, raw / "big.parquet", row_group_size=5_000)
    base = {"dataset": flat_spec(raw), "target_shard_rows": 900, "shuffle": "global"}
    whole = run_reshard(ReshardConfig(**base, output_root=str(tmp_path / "a")), dask_client)
    cut = run_reshard(
        ReshardConfig(**base, output_root=str(tmp_path / "b"), max_piece_rows=700), dask_client
    )
    digests = lambda result: [s.sha256 for s in result.manifest.split("train").shards]  # noqa: E731
    assert digests(whole) == digests(cut)
    read = read_rows(str(raw / "big.parquet"), 1_400, 700, reading=CsvReading())
    assert read.column("id").to_pylist() == list(range(1_400, 2_100))


def test_a_small_object_is_read_in_one_request_a_large_one_in_ranges(tmp_path) -> None:
    """Invariants: scanning an S3 object of at most WHOLE_READ_BYTES costs one GET of its
    whole body (no footer and column-chunk round trips); a larger one is streamed, its
    footer fetched before its data; both scans count the same rows as the local files
    do."""
    import fsspec

    from preprocessing.scan.inputs import scan_file
    from preprocessing.storage.sources import WHOLE_READ_BYTES, list_inputs
    from tests.preprocessing.s3_requests import counted_s3

    local = tmp_path / "raw"
    local.mkdir()
    pq.write_table(flat_table(0, 2_000, 1), local / "small.parquet")
    pq.write_table(flat_table(2_000, 200_000, 2), local / "large.parquet", row_group_size=50_000)
    sizes = {path.name: path.stat().st_size for path in local.iterdir()}
    assert sizes["small.parquet"] <= WHOLE_READ_BYTES < sizes["large.parquet"]
    spec = flat_spec(local)
    expected = {
        Path(f.uri).name: scan_file(f, spec, 0, 0.0, 100_000).counts for f in list_inputs(spec)
    }
    with counted_s3() as log:
        fsspec.filesystem("s3").mkdir("whole")
        fsspec.filesystem("s3").put(f"{local}/", "whole/raw/", recursive=True)
        s3_spec = DatasetSpec(inputs=["s3://whole/raw/*.parquet"], feature_columns=["f0", "f1"])
        for file in list_inputs(s3_spec):
            name = Path(file.uri).name
            log.clear()
            assert scan_file(file, s3_spec, 0, 0.0, 100_000).counts == expected[name]
            gets = [r for r in log.requests if r.method == "GET" and name in r.path]
            if name == "small.parquet":
                assert [r.bytes_moved for r in gets] == [sizes[name]]
            else:
                assert len(gets) > 1 and gets[0].bytes_moved < sizes[name]


@given(batches=st.lists(st.lists(st.integers(-50, 50), max_size=30), max_size=6))
@settings(max_examples=300, deadline=None)
def test_a_files_ids_give_its_duplicates_and_range_however_they_are_batched(batches) -> None:
    """Invariants: over any batching, the scan's id tally names exactly the ids that occur
    more than once (each extra occurrence, sorted), and the lowest and highest id; ids
    rising strictly through the file are never joined or sorted."""
    tally = IdTally()
    for batch in batches:
        tally.add(np.array(batch, dtype=np.int64))
    every = [value for batch in batches for value in batch]
    extra = sorted(v for v, n in Counter(every).items() for _ in range(n - 1))
    assert tally.repeated().tolist() == extra
    assert (tally.low, tally.high) == ((min(every), max(every)) if every else (None, None))
    rising = all(a < b for a, b in pairwise(every))
    assert tally.rising == rising


@given(
    keys=st.lists(st.integers(0, 1 << 40), max_size=40),
    spread=st.sampled_from([1, 7, 1 << 12, 1 << 40]),
)
@settings(max_examples=300, deadline=None)
def test_a_batchs_key_counts_are_numpys_unique_counts_over_any_key_range(keys, spread) -> None:
    """Invariant: the scan's count of each row key (a count over the key range when that
    range is small, else a sort) gives exactly numpy's distinct keys and counts, in order."""
    key = np.array([value % spread + (1 << 30) for value in keys], dtype=np.int64)
    found, counts = _distinct_counts(key)
    expected, expected_counts = np.unique(key, return_counts=True)
    assert found.tolist() == expected.tolist()
    assert counts.tolist() == expected_counts.tolist()
