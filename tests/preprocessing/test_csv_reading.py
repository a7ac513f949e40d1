"""How ballast reads the text of a CSV input (`dataset.csv_empty_text`,
preprocessing/storage/csv_reading.py), checked against the real clients a user compares
with, pandas.read_csv and polars.read_csv: under `missing` a cell is null where both read
null and a value where both read a value, and where they disagree ballast reads as the
module's docstring says; under `empty_string` (the default) it reads exactly as before
(pyarrow's CSV reader with its default options)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.cli.main import main
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import ReshardResult, TooManyRejected, run_reshard
from preprocessing.scan.feature_stats import InputError
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import iter_batches, read_rows, stream_schema
from preprocessing.toolbox.setting_marks import comparable_settings

MISSING, BEFORE = CsvReading("missing"), CsvReading()
# Words pyarrow (in columns of numbers) or pandas (in any column) read as null: the
# property below leaves them out of its text, the table of cases checks them one by one.
SENTINELS = {
    *pa_csv.ConvertOptions().null_values,
    *("None", "<NA>", "NULL", "nan", "-nan", "n/a", "#NA", "NaN", "-NaN", "1.#QNAN"),
}


def read(path: Path, reading: CsvReading) -> pa.Table:
    """A file as ballast's streaming reader reads it."""
    return pa.Table.from_batches(list(iter_batches(str(path), reading=reading)))


def null_masks(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per column: (ballast under `missing`, pandas, Polars) null masks of the file."""
    ours = read(path, MISSING)
    theirs_pd, theirs_pl = pd.read_csv(path), pl.read_csv(path)
    return {
        name: (
            np.asarray(ours.column(name).is_null()),
            theirs_pd[name].isna().to_numpy(),
            theirs_pl[name].is_null().to_numpy(),
        )
        for name in ours.column_names
    }


CASES = b"""text,number,empty,label
a,1,,yes
,,,
NA,NA,,no
null,null,,yes
N/A,N/A,,no
"",3,,""
 ,4,,\x20
"""


def test_each_kind_of_cell_reads_as_pandas_and_polars_agree_or_as_documented(tmp_path) -> None:
    """Invariant, cell by cell (the cases of csv_reading.py's docstring): an empty field is
    null in every column, and spaces are text, as pandas and Polars both read them; a
    quoted empty field is null (pandas; Polars reads ""); NA, null, N/A in a text column
    are text (Polars; pandas reads null) and in a column of numbers null (pandas, and
    ballast before); a column with no value is all null; the label column reads as any
    other. Under `empty_string` only the empty text values differ: "" instead of null."""
    path = tmp_path / "cases.csv"
    path.write_bytes(CASES)
    new, old = read(path, MISSING), read(path, BEFORE)
    assert new.column("text").to_pylist() == ["a", None, "NA", "null", "N/A", None, " "]
    assert new.column("number").to_pylist() == [1, None, None, None, None, 3, 4]
    assert new.column("empty").null_count == 7
    assert new.column("label").to_pylist() == ["yes", None, "no", "yes", "no", None, " "]
    assert old.column("text").to_pylist() == ["a", "", "NA", "null", "N/A", "", " "]
    assert old.column("label").to_pylist() == ["yes", "", "no", "yes", "no", "", " "]
    assert old.column("number").equals(new.column("number")) and old.schema == new.schema
    for name, (ours, by_pandas, by_polars) in null_masks(path).items():
        agree = by_pandas == by_polars
        assert (ours[agree] == by_pandas[agree]).all(), name
    frame = pl.read_csv(path)
    assert frame["text"].to_list()[5] == "" and pd.read_csv(path)["text"].isna()[5]
    assert frame["number"].dtype == pl.String  # Polars: NA makes the numbers text


# Text a user's CSV holds: any unicode but surrogates and control characters, commas,
# quotes, spaces, line breaks (in quotes), but none of the null words (checked above).
TEXT = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), whitelist_characters="\n"),
    min_size=1,
    max_size=8,
).filter(lambda value: value not in SENTINELS and value.strip() not in SENTINELS)
EMPTY = st.sampled_from(["", '""'])  # an empty field, unquoted or quoted
TEXT_CELL = st.one_of(EMPTY, TEXT.map(lambda value: '"' + value.replace('"', '""') + '"'))
NUMBER_CELL = st.one_of(EMPTY, st.integers(-(10**6), 10**6).map(str))


@st.composite
def hostile_csv(draw: st.DrawFn) -> bytes:
    """A CSV of 2-5 columns, each text or numbers, of 1-40 rows, empties anywhere."""
    kinds = draw(st.lists(st.sampled_from([TEXT_CELL, NUMBER_CELL]), min_size=2, max_size=5))
    num_rows = draw(st.integers(1, 40))
    lines = [",".join(f"c{i}" for i in range(len(kinds)))]
    lines += [",".join(draw(kind) for kind in kinds) for _ in range(num_rows)]
    return ("\n".join(lines) + "\n").encode()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(hostile_csv())
def test_nulls_are_where_pandas_and_polars_read_them_and_the_old_reading_is_unchanged(
    tmp_path, text: bytes
) -> None:
    """Invariant over hostile files (empties and quoted empties anywhere, unicode, commas
    and quotes in values, numbers with empties): under `missing` a cell is null where
    pandas and Polars both read null and a value where both read one; where they disagree
    (a quoted empty field, which Polars reads as "") it is null; the values Polars reads as
    text are the same text. Under `empty_string` the file reads exactly as pyarrow's CSV
    reader with its defaults, ballast's reading before. Either way the schema is the one
    `stream_schema` gives and `read_rows` reads the same rows."""
    path = tmp_path / "hostile.csv"
    path.write_bytes(text)
    new = read(path, MISSING)
    polars = pl.read_csv(io.BytesIO(text), infer_schema_length=None)
    for name, (ours, by_pandas, by_polars) in null_masks(path).items():
        agree = by_pandas == by_polars
        assert (ours[agree] == by_pandas[agree]).all(), name
        assert ours[~agree].all() and (polars[name].to_numpy()[~agree] == "").all(), name
        if pa.types.is_string(new.schema.field(name).type) and polars[name].dtype == pl.String:
            kept = ~ours
            assert new.column(name).to_numpy(zero_copy_only=False)[kept].tolist() == (
                polars[name].to_numpy()[kept].tolist()
            )
    assert read(path, BEFORE).equals(pa_csv.read_csv(path))
    for reading, table in ((MISSING, new), (BEFORE, read(path, BEFORE))):
        assert stream_schema(str(path), reading=reading) == table.schema
        first = table.num_rows // 2  # a piece that starts inside the file, to its end
        piece = read_rows(str(path), first, table.num_rows - first, reading=reading)
        assert piece.equals(table.slice(first))


def test_the_setting_defaults_to_the_old_reading_outside_the_version_id() -> None:
    """Invariant: a config that does not name `csv_empty_text` reads as before and its
    settings (what a version id hashes) do not hold the field; `missing` is hashed; a
    value outside the two is refused naming the field."""
    spec = DatasetSpec(inputs=["raw"])
    assert CsvReading.of(spec) == BEFORE
    dumped = ReshardConfig(dataset=spec, output_root="out").model_dump()
    assert "csv_empty_text" not in comparable_settings(dumped)["dataset"]
    new = ReshardConfig(dataset={"inputs": ["raw"], "csv_empty_text": "missing"}, output_root="o")
    assert comparable_settings(new.model_dump())["dataset"]["csv_empty_text"] == "missing"
    assert CsvReading.of(new.dataset) == MISSING
    with pytest.raises(ValueError, match="csv_empty_text"):
        DatasetSpec(inputs=["raw"], csv_empty_text=None)  # YAML's `null` is not a value


def write_flights(raw: Path) -> None:
    """40 flights as a CSV a user exports: 4 cancelled ones have no label (an empty
    field), 3 have no carrier (2 empty, 1 quoted empty), every delay is a number."""
    raw.mkdir(parents=True)
    lines = ["id,carrier,delay,label"]
    for row in range(40):
        carrier = {5: "", 17: '""', 30: ""}.get(row, "UA" if row % 3 else "B6")
        label = "" if row in (3, 9, 21, 33) else ("late" if row % 2 else "on_time")
        lines.append(f"{row},{carrier},{row % 7 * 4.5},{label}")
    (raw / "flights.csv").write_text("\n".join(lines) + "\n")


def reshard_flights(tmp_path: Path, client: object, **dataset: object) -> ReshardResult:
    spec = {
        "inputs": [str(tmp_path / "raw")],
        "source_column": None,
        "id_column": "id",
        "feature_columns": ["carrier", "delay"],
        **dataset,
    }
    config = ReshardConfig(
        dataset=DatasetSpec.model_validate(spec),
        output_root=str(tmp_path / "out"),
        holdout_fraction=0.2,
    )
    return run_reshard(config, client)


@pytest.mark.slow
def test_an_empty_label_is_unlabelled_under_missing_and_a_class_only_under_the_old_reading(
    tmp_path, dask_client
) -> None:
    """Invariants, through the reshard on a Dask cluster: under `csv_empty_text: missing`
    the 4 rows with an empty label are left out by `unlabelled: drop` and counted, not made
    a class "" (under `refuse`, the file is rejected naming it, the column and the first
    such row); the empty carriers are nulls met by the column's policy, and without one
    the scan fails naming the file, the column and the setting to choose. A config without
    the field reads as before (the class "" is there, as the old reading made it) and has
    the version id of the same config naming `empty_string`, another than `missing`'s."""
    write_flights(tmp_path / "raw")
    with pytest.raises(InputError, match=r"feature column 'carrier' holds 3 null rows.*flights"):
        reshard_flights(tmp_path, dask_client, csv_empty_text="missing")
    refused = r"flights\.csv: 4 null or NaN labels in column 'label' \(the first at row 3 "
    with pytest.raises(TooManyRejected, match=refused):
        reshard_flights(
            tmp_path,
            dask_client,
            csv_empty_text="missing",
            nulls={"carrier": "fill_zero"},
            unlabelled="refuse",
        )
    new = reshard_flights(
        tmp_path, dask_client, csv_empty_text="missing", nulls={"carrier": "fill_zero"}
    ).manifest
    assert sorted(new.classes) == ["late", "on_time"]
    assert list(new.features["unlabelled_rows"].values()) == [4]
    assert sum(split.num_rows for split in new.splits.values()) == 36
    old = reshard_flights(tmp_path, dask_client)
    assert sorted(old.manifest.classes) == ["", "late", "on_time"]
    assert sum(split.num_rows for split in old.manifest.splits.values()) == 40
    named = reshard_flights(tmp_path, dask_client, csv_empty_text="empty_string")
    assert named.reused and named.manifest.version_id == old.manifest.version_id
    assert new.version_id != old.manifest.version_id


def test_init_reads_as_it_proposes_and_writes_the_reading_with_its_comment(
    tmp_path, capsys
) -> None:
    """Invariants: `ballast init` on a CSV surveys it under `missing` (the 4 empty labels
    are unlabelled rows, the 3 empty carriers nulls given a policy) and writes
    `csv_empty_text: missing` with a comment saying what it means, in a config that
    validates; on the same rows as Parquet, which no reading touches, it writes nothing."""
    write_flights(tmp_path / "raw")
    assert main(["init", "--inputs", str(tmp_path / "raw")]) == 0
    text = capsys.readouterr().out
    dataset = yaml.safe_load(text.replace("${WORK_DIR}", str(tmp_path)))["reshard"]["dataset"]
    assert DatasetSpec.model_validate(dataset).csv_empty_text == "missing"
    assert "csv_empty_text: missing  # an empty field of a CSV text column is a null" in text
    assert dataset["nulls"] == {"carrier": "fill_zero"} and dataset["unlabelled"] == "drop"
    assert "unlabelled: drop  # CONFIRM: 4 rows have no 'label'" in text
    assert "# classes of 'label' (rows): late: 16, on_time: 20" in text
    table = read(tmp_path / "raw" / "flights.csv", MISSING)
    pq.write_table(table, tmp_path / "flights.parquet")
    assert main(["init", "--inputs", str(tmp_path / "flights.parquet")]) == 0
    assert "csv_empty_text" not in capsys.readouterr().out
