"""Rows without a label and features that identify rows, through a real reshard: what is
dropped is counted per file where a person reads it, what is refused names the file, the
row and the setting; ISO 8601 date strings are temporal features in the scan and the
codec alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client

from preprocessing.contract.codec import FeatureCodec, seconds
from preprocessing.contract.column_spec import FeatureError
from preprocessing.contract.notices import identifying_lines, unlabelled_lines
from preprocessing.driver.reshard import TooManyRejected
from preprocessing.plan.distinct import (
    SKETCH_SIZE,
    distinct_count,
    fold_hashes,
    value_hashes,
)
from preprocessing.scan.feature_stats import InputError
from tests.feature_data import codec_classifier, reshard, train_mlp
from tracking.lifecycle.scoring import predictions


def labelled_rows(first_id: int, num_rows: int, unlabelled: list[int], seed: int = 0) -> pa.Table:
    """`num_rows` rows with labels a/b/c, null at the positions `unlabelled`."""
    rng = np.random.default_rng(seed)
    labels = pa.array(
        rng.choice(["a", "b", "c"], num_rows), mask=np.isin(np.arange(num_rows), unlabelled)
    )
    return pa.table(
        {
            "id": np.arange(first_id, first_id + num_rows),
            "label": labels,
            "x": rng.normal(size=num_rows),
            "key": [f"k-{i}" for i in range(first_id, first_id + num_rows)],
            "day": [f"2024-03-{1 + i % 28:02d}" for i in range(num_rows)],
        }
    )


def write_files(raw: Path, unlabelled: dict[str, list[int]]) -> pa.Table:
    raw.mkdir(parents=True)
    tables = []
    for index, (name, rows) in enumerate(unlabelled.items()):
        tables.append(labelled_rows(100 * index, 100, rows, seed=index))
        pq.write_table(tables[-1], raw / name)
    return pa.concat_tables(tables)


@pytest.mark.slow
def test_unlabelled_rows_are_dropped_and_counted_per_file_and_still_predicted(
    tmp_path, dask_client: Client
) -> None:
    """Invariants: under the default `unlabelled: drop` the rows without a label are in no
    split, counted per file in the manifest (and within its dropped rows), named per file
    by the lines the run log and the summary print; batch inference's `predictions` still
    predicts every raw row, unlabelled ones included."""
    raw = write_files(
        tmp_path / "raw", {"a.parquet": [11, 40], "b.parquet": [], "c.parquet": [0, 1, 2]}
    )
    result = reshard(
        tmp_path / "raw",
        tmp_path / "out",
        dask_client,
        {"feature_columns": ["x", "day"], "date_columns": ["day"]},
    )
    manifest = result.manifest
    counts = {uri.rsplit("/", 1)[-1]: n for uri, n in manifest.features["unlabelled_rows"].items()}
    assert counts == {"a.parquet": 2, "c.parquet": 3}
    assert sum(manifest.features["dropped_rows"].values()) == 5
    assert sum(split.num_rows for split in manifest.splits.values()) == 295
    lines = unlabelled_lines(manifest)
    assert lines[0].startswith("5 rows without a label ('label') left out")
    assert any(line.strip().endswith("a.parquet: 2") for line in lines)
    specs = {spec.name: spec for spec in FeatureCodec.from_manifest(manifest).columns}
    assert specs["day"].kind == "temporal" and specs["day"].arrow_type == "string"
    model = codec_classifier(train_mlp(result.manifest_uri, epochs=1), result.manifest_uri)
    predicted = predictions(model, raw, "id")
    assert predicted.num_rows == raw.num_rows == 300


@pytest.mark.slow
def test_refused_unlabelled_rows_name_the_file_the_first_row_and_the_setting(
    tmp_path, dask_client: Client
) -> None:
    """Invariant: under `unlabelled: refuse` a file holding null labels is rejected with
    its name, the first null row's index in the file (not a batch start) and the setting."""
    write_files(tmp_path / "raw", {"a.parquet": [], "b.parquet": [11, 40]})
    with pytest.raises(
        TooManyRejected,
        match=r"b\.parquet: 2 null or NaN labels in column "
        r"'label' \(the first at row 11 of the file\); dataset\.unlabelled is "
        r"'refuse'",
    ):
        reshard(
            tmp_path / "raw",
            tmp_path / "out",
            dask_client,
            {"feature_columns": ["x"], "unlabelled": "refuse"},
        )


@pytest.mark.slow
def test_a_feature_that_identifies_rows_is_named_and_refused_under_the_setting(
    tmp_path, dask_client: Client
) -> None:
    """Invariants: a string feature with one value per row is named in the warning lines
    (run log, summary) with its distinct and row counts, and the repeated `day` is not;
    under `on_identifying_feature: refuse` the scan fails naming it and the setting."""
    write_files(tmp_path / "raw", {"a.parquet": [], "b.parquet": []})
    dataset = {"feature_columns": ["x", "key", "day"], "max_categories": 1000}
    manifest = reshard(tmp_path / "raw", tmp_path / "out", dask_client, dataset).manifest
    found = manifest.features["identifying_columns"]
    assert list(found) == ["key"] and found["key"]["distinct"] == found["key"]["rows"] > 100
    assert identifying_lines(manifest)[0].startswith("feature column 'key' holds about")
    with pytest.raises(
        InputError,
        match=r"feature column 'key' .* identifies rows .*"
        r"dataset\.on_identifying_feature is 'refuse'",
    ):
        reshard(
            tmp_path / "raw",
            tmp_path / "out2",
            dask_client,
            {**dataset, "on_identifying_feature": "refuse"},
        )


def test_the_distinct_sketch_is_exact_below_its_size_and_close_above_it() -> None:
    """Invariants: below SKETCH_SIZE distinct values the count is exact, whatever the
    repeats; 200,000 distinct integers folded in 7 parts (as files merge) are estimated
    within 5%; strings hash alike in every call."""
    small = fold_hashes(np.zeros(0, np.uint64), value_hashes(np.arange(1000) % 700))
    assert distinct_count(small) == 700
    sketch = np.zeros(0, np.uint64)
    for part in np.array_split(np.arange(200_000), 7):
        sketch = fold_hashes(sketch, value_hashes(part))
    assert len(sketch) == SKETCH_SIZE
    assert abs(distinct_count(sketch) - 200_000) < 10_000
    words = np.array(["a", "b", "a"], dtype=object)
    assert (value_hashes(words) == value_hashes(words.copy())).all()


def test_date_strings_encode_as_the_seconds_of_their_timestamps() -> None:
    """Invariants: ISO 8601 dates and timestamps (with T, Z or an offset) give the seconds
    of the same instants as a timestamp column; a string that is no date is a FeatureError
    naming the value."""
    strings = pa.array(["2024-03-01", "2024-03-01T12:30:00Z", "2024-03-01 12:30:00+01:00", None])
    expected = [1709251200.0, 1709296200.0, 1709292600.0, None]
    assert seconds(strings).to_pylist() == expected
    with pytest.raises(FeatureError, match="'next tuesday' is not an ISO 8601 date"):
        seconds(pa.array(["2024-03-01", "next tuesday"]))
