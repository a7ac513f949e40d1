"""Bad rows and bad columns fail the reshard with one clear message, before anything is
written: each test checks the message names the file or column, the count and the fix,
and that the output root holds no version and no staging."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from distributed import Client
from pydantic import ValidationError

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import TooManyRejected, run_reshard
from preprocessing.scan.feature_stats import InputError


def rows(first_id: int, num_rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table(
        {
            "id": np.arange(first_id, first_id + num_rows),
            "label": rng.integers(0, 3, num_rows),
            "x": rng.normal(size=num_rows),
        }
    )


def write(directory: Path, name: str, table: pa.Table) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if name.endswith(".csv"):
        pa_csv.write_csv(table, directory / name)
    elif name.endswith(".jsonl"):
        lines = (json.dumps(row) for row in table.to_pylist())
        (directory / name).write_text("\n".join(lines) + "\n")
    else:
        pq.write_table(table, directory / name)


def reshard(tmp_path: Path, client: Client, **dataset: object) -> None:
    spec = {
        "inputs": [str(tmp_path / "raw")],
        "source_column": None,
        "id_column": "id",
        "feature_columns": ["x"],
        **dataset,
    }
    run_reshard(
        ReshardConfig(
            dataset=DatasetSpec.model_validate(spec),
            output_root=str(tmp_path / "out"),
            holdout_fraction=0.2,
        ),
        client,
    )


def assert_nothing_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert not list(out.glob("v-*")) and not (out / "_staging").exists()


@pytest.mark.slow
def test_nulls_under_the_default_policy_name_column_count_files_and_fix(
    tmp_path, dask_client
) -> None:
    """Invariant: nulls in a feature column without a policy fail the scan with the column,
    the null count, the files holding them and the setting that fixes it."""
    table = rows(0, 40)
    write(
        tmp_path / "raw",
        "a.csv",
        table.set_column(
            2, "dep_delay", pa.array([None if i % 10 == 0 else 1.5 for i in range(40)])
        ),
    )
    write(tmp_path / "raw", "b.csv", rows(40, 40).rename_columns(["id", "label", "dep_delay"]))
    with pytest.raises(
        InputError,
        match=r"feature column 'dep_delay' holds 4 null rows "
        r"\(in file://\S+/a\.csv\); choose a null policy, e\.g\. "
        r"`dataset\.nulls: \{dep_delay: fill_mean\}`",
    ):
        reshard(tmp_path, dask_client, feature_columns=["dep_delay"])
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_nan_labels_are_refused_naming_file_and_column(tmp_path, dask_client) -> None:
    """Invariant: under `unlabelled: refuse`, NaN labels (not nulls: a float column) reject
    the file by name, with the first NaN's row and the setting, instead of a bare
    StopIteration from the plan."""
    table = rows(0, 30)
    labels = table.column("label").to_numpy().astype(float)
    labels[[3, 7]] = np.nan
    write(tmp_path / "raw", "nan.parquet", table.set_column(1, "label", pa.array(labels)))
    with pytest.raises(
        TooManyRejected,
        match=r"nan\.parquet: 2 null or NaN labels in column "
        r"'label' \(the first at row 3 of the file\); dataset\.unlabelled",
    ):
        reshard(tmp_path, dask_client, unlabelled="refuse")
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_a_float_label_with_too_many_values_is_called_a_regression_target(
    tmp_path, dask_client
) -> None:
    """Invariant: more distinct label values over all files than max_classes (each file
    below it) fails, naming the column and the count."""
    for index in range(2):
        table = rows(100 * index, 30)
        write(
            tmp_path / "raw",
            f"{index}.parquet",
            table.set_column(1, "label", pa.array(np.arange(30) + 0.5 + 100 * index)),
        )
    with pytest.raises(
        InputError,
        match=r"label column 'label' holds 60 distinct values, "
        r"more than dataset.max_classes=40 \(a regression target\?",
    ):
        reshard(tmp_path, dask_client, max_classes=40)
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_mixed_label_types_across_files_name_the_file_and_types(tmp_path, dask_client) -> None:
    """Invariant: a JSON Lines file whose labels are strings, beside CSV files with integer
    labels, is refused naming the file, the column and both types."""
    write(tmp_path / "raw", "a.csv", rows(0, 30))
    write(tmp_path / "raw", "b.csv", rows(30, 30))
    strings = rows(60, 30)
    write(
        tmp_path / "raw",
        "c.jsonl",
        strings.set_column(
            1, "label", pa.array([f"class-{v}" for v in strings.column("label").to_pylist()])
        ),
    )
    with pytest.raises(
        TooManyRejected,
        match=r"c\.jsonl: schema drift: column 'label' is "
        r"string, expected int64",
    ):
        reshard(tmp_path, dask_client)
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_null_ids_are_refused(tmp_path, dask_client) -> None:
    """Invariant: a row without an id rejects its file, naming the id column."""
    table = rows(0, 20)
    ids = pa.array([None if i == 4 else i for i in range(20)], pa.int64())
    write(tmp_path / "raw", "a.csv", table.set_column(0, "id", ids))
    with pytest.raises(TooManyRejected, match=r"a\.csv: 1 null ids in column 'id'"):
        reshard(tmp_path, dask_client)
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_duplicate_ids_in_one_file_are_refused(tmp_path, dask_client) -> None:
    """Invariant: an id held by two rows of one file rejects it, naming an example."""
    ids = np.arange(20)
    ids[9] = 7
    write(tmp_path / "raw", "a.parquet", rows(0, 20).set_column(0, "id", pa.array(ids)))
    with pytest.raises(
        TooManyRejected,
        match=r"a\.parquet: column 'id' holds 1 duplicate "
        r"ids \(e\.g\. 7\)",
    ):
        reshard(tmp_path, dask_client)
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_duplicate_ids_across_files_name_both_files(tmp_path, dask_client) -> None:
    """Invariant: files whose id ranges overlap are read for their ids; one shared id fails
    the run naming it and both files (disjoint files are not read again)."""
    write(tmp_path / "raw", "a.parquet", rows(0, 20))
    write(
        tmp_path / "raw",
        "b.parquet",
        rows(100, 20).set_column(0, "id", pa.array([*range(100, 119), 13])),
    )
    write(tmp_path / "raw", "c.parquet", rows(500, 20))
    with pytest.raises(
        InputError,
        match=r"id 13 is in both \S+/a\.parquet and "
        r"\S+/b\.parquet",
    ):
        reshard(tmp_path, dask_client)
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_a_string_id_column_is_refused_with_the_fix(tmp_path, dask_client) -> None:
    """Invariant: string ids are refused, saying ids must be integers and how to fix it."""
    table = rows(0, 20)
    write(
        tmp_path / "raw",
        "a.jsonl",
        table.set_column(0, "id", pa.array([f"row-{i}" for i in range(20)])),
    )
    with pytest.raises(
        TooManyRejected,
        match=r"a\.jsonl: id column 'id' is string: ids must "
        r"be integers \(cast the column",
    ):
        reshard(tmp_path, dask_client)
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_an_input_column_named_like_an_internal_one_is_refused(tmp_path, dask_client) -> None:
    """Invariant: an input column `__ballast_shard` is refused by name (it used to fail
    the map stage with "Field exists 2 times")."""
    write(
        tmp_path / "raw",
        "a.parquet",
        rows(0, 20).append_column("__ballast_shard", pa.array(np.zeros(20, dtype=np.int32))),
    )
    with pytest.raises(
        TooManyRejected,
        match=r"columns \['__ballast_shard'\] collide with "
        r"ballast's internal columns",
    ):
        reshard(tmp_path, dask_client)
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_null_fixed_size_list_features_reject_the_file_by_column(tmp_path, dask_client) -> None:
    """Invariant: null lists in a fixed-size-list feature, which pyarrow cannot read back
    (docs/architecture.md M20), reject the file naming the column at the scan, instead of
    crashing the map stage."""
    values = pa.array(np.arange(80, dtype=np.float32))
    lists = pa.FixedSizeListArray.from_arrays(values, 4, mask=pa.array([i == 5 for i in range(20)]))
    write(tmp_path / "raw", "a.parquet", rows(0, 20).append_column("features", lists))
    with pytest.raises(
        TooManyRejected,
        match=r"a\.parquet: fixed-size list columns "
        r"\['features'\] hold null lists",
    ):
        reshard(tmp_path, dask_client, feature_columns=["features"])
    assert_nothing_written(tmp_path)


@pytest.mark.slow
def test_a_fill_policy_that_does_not_apply_to_the_kind_is_refused(tmp_path, dask_client) -> None:
    """Invariant: fill_mean on a string column is refused naming the column, its kind and
    the policies that apply."""
    write(tmp_path / "raw", "a.csv", rows(0, 20).append_column("city", pa.array(["x"] * 20)))
    with pytest.raises(
        InputError,
        match=r"fill_mean does not apply to feature column 'city' "
        r"\(category, string\); use one of \['error', 'drop_row', 'fill_zero'\]",
    ):
        reshard(tmp_path, dask_client, feature_columns=["x", "city"], nulls={"city": "fill_mean"})
    assert_nothing_written(tmp_path)


def test_a_null_policy_for_a_column_that_is_no_feature_is_a_config_error() -> None:
    """Invariant: dataset.nulls may only name feature columns; the error says which."""
    with pytest.raises(
        ValidationError,
        match=r"dataset.nulls names \['dep_dealy'\], which "
        r"are not feature columns",
    ):
        DatasetSpec(inputs=["x"], feature_columns=["dep_delay"], nulls={"dep_dealy": "drop_row"})


@pytest.mark.slow
def test_a_configured_column_no_file_has_is_one_error_naming_the_field(
    tmp_path, dask_client
) -> None:
    """Invariant: a label and a feature column that no input file has fail the run once,
    naming each config field, the closest column the files do have and their columns;
    not one schema-drift rejection per file."""
    for part in range(3):
        write(
            tmp_path / "raw",
            f"{part}.parquet",
            rows(100 * part, 20).rename_columns(["id", "Species", "Body Mass (g)"]),
        )
    with pytest.raises(InputError) as raised:
        reshard(tmp_path, dask_client, label_column="species", feature_columns=["Body Mass (kg)"])
    message = str(raised.value)
    assert "dataset.label_column is 'species'" in message and "'Species'?" in message
    assert "dataset.feature_columns[0] is 'Body Mass (kg)'" in message
    assert "'Body Mass (g)'?" in message and "schema drift" not in message
    assert message.count("dataset.") == 2
    assert_nothing_written(tmp_path)
