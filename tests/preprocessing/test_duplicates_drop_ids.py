"""`dataset.duplicates: drop` with `dataset.id_column` on the session cluster: ids are
checked on the rows the drop keeps. A re-sent copy (same id, same content) is left out
like any copy; two rows written with one id (contents that differ, in a file, across
files, or beside a copy) are refused naming the id and its files; across nights the ids
a chain committed stay unique, so a file an earlier night committed, sent again, is
refused, and `mode: full` drops it as a copy."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.cli.main import main
from preprocessing.driver.reshard import run_reshard
from preprocessing.scan.feature_stats import InputError
from tests.preprocessing.test_duplicates_drop import ROWS, content_key, reshard_config, written

pytestmark = pytest.mark.slow  # every test here uses the session Dask cluster

Row = tuple[int, tuple]  # (id, (label, x, y, s))


@st.composite
def id_nights(draw: st.DrawFn) -> list[list[Row]]:
    """Files of (id, row): each distinct content with an id of its own; copies within and
    across files that keep their id (a re-sent file) or take a new one (an export that
    renumbers rows); at times a row of new content under an id already used (a clash)."""
    base = draw(st.lists(ROWS, min_size=1, max_size=10, unique_by=content_key))
    rows = list(enumerate(base))
    picks = st.lists(st.integers(0, len(rows) - 1), max_size=20)
    files = [[rows[i] for i in draw(picks)] for _ in range(draw(st.integers(0, 3)))]
    files.insert(draw(st.integers(0, len(files))), rows)
    for index in draw(st.lists(st.integers(0, len(files) - 1), max_size=2)):  # renumbered
        files[index] = [(row_id + 1000, row) for row_id, row in files[index]]
    if draw(st.booleans()):  # a new content under a used id
        row_id = draw(st.sampled_from([row_id for rows in files for row_id, _ in rows]))
        fresh = (0, 1e9, 0, "clash")
        at = draw(st.integers(0, len(files) - 1))
        files[at].insert(draw(st.integers(0, len(files[at]))), (row_id, fresh))
    return files


def write_id_files(raw: Path, files: list[list[Row]], names: list[str] | None = None) -> None:
    """Write each file of (id, row) as its name (f<index>.parquet by default)."""
    raw.mkdir(parents=True, exist_ok=True)
    for index, rows in enumerate(files):
        columns = list(zip(*(row for _, row in rows), strict=True)) if rows else [[]] * 4
        table = pa.table(
            {
                "id": pa.array([row_id for row_id, _ in rows], pa.int64()),
                "label": pa.array(columns[0], pa.int64()),
                "x": pa.array(columns[1], pa.float64()),
                "y": pa.array(columns[2], pa.int64()),
                "s": pa.array(columns[3], pa.string()),
            }
        )
        name = names[index] if names else f"f{index:02d}.parquet"
        pq.write_table(table, raw / name, row_group_size=7)


def rows_written(files: list[list[Row]]) -> list[tuple[str, int]]:
    """(file, id) of the rows `drop` writes: of each content, the first by (file, row)
    among rows the scan keeps (`y` null: left out by its `drop_row` policy)."""
    seen, kept = set(), []
    for index, rows in enumerate(files):
        for row_id, row in rows:
            if row[2] is not None and content_key(row) not in seen:
                seen.add(content_key(row))
                kept.append((f"f{index:02d}.parquet", row_id))
    return kept


def id_config(raw: Path, root: Path, mode: str = "incremental"):
    config = reshard_config(raw, root, "drop", None)
    dataset = config.dataset.model_copy(update={"id_column": "id"})
    return config.model_copy(update={"dataset": dataset, "mode": mode})


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(files=id_nights())
def test_ids_are_checked_on_the_rows_the_drop_keeps(
    files: list[list[Row]], tmp_path_factory, dask_client
) -> None:
    """Invariants, over hostile tables with an id column (copies that keep or renumber
    their id, NaN, -0.0, nulls, empty files, a new content under a used id anywhere): the
    run is refused exactly when two rows it would write share an id, and the error names
    such an id, the column and the files that hold it; otherwise the rows written are
    exactly the first copies, by id, the delta counts every other copy as dropped
    (renumbered ones too), and `ballast verify` passes."""
    base = tmp_path_factory.mktemp("ids")
    write_id_files(base / "raw", files)
    kept = rows_written(files)
    holders: dict[int, set[str]] = {}
    for name, row_id in kept:
        holders.setdefault(row_id, set()).add(name)
    clashes = {row_id for row_id, n in Counter(i for _, i in kept).items() if n > 1}
    config = id_config(base / "raw", base / "out")
    if clashes:
        with pytest.raises(InputError) as raised:
            run_reshard(config, dask_client)
        said = str(raised.value)
        found = re.search(r"column 'id': id (-?\d+) is in", said)
        assert found and int(found.group(1)) in clashes, said
        named = set(re.findall(r"f\d\d\.parquet", said.split(";")[0]))
        assert named and named <= holders[int(found.group(1))], said
        return
    try:
        result = run_reshard(config, dask_client)
    except ValueError as error:  # no row kept, or every content drawn into the holdout
        assert "no training rows" in str(error)
        return
    ids = [i for table in written(result).values() for i in table.column("id").to_pylist()]
    assert Counter(ids) == Counter(row_id for _, row_id in kept)
    values = result.manifest.deltas[-1].split_values  # renumbered copies counted too
    scanned = sum(1 for rows in files for _, row in rows if row[2] is not None)
    assert sum(v["dropped_duplicates"] for v in values.values()) == scanned - len(kept)
    assert main(["verify", str(base / "out")]) == 0


def test_a_resent_file_with_an_id_column_is_dropped_to_its_first_copies(
    tmp_path, dask_client
) -> None:
    """Invariant: a file re-sent under a new name, its ids and contents the same, is
    accepted under `drop` and left out whole: the version holds each id once; a row of
    new content under a used id is refused naming the id, the column and both files (or
    the file and both rows, within one file, beside copies that keep their ids)."""
    rows = [(i, (i % 3, float(i), i % 2, "r")) for i in range(30)]
    write_id_files(tmp_path / "raw", [rows, rows], ["a.parquet", "b-resent.parquet"])
    result = run_reshard(id_config(tmp_path / "raw", tmp_path / "out"), dask_client)
    ids = [i for table in written(result).values() for i in table.column("id").to_pylist()]
    assert sorted(ids) == list(range(30))
    assert result.manifest.features["duplicates_dropped"] == {
        (tmp_path / "raw" / "b-resent.parquet").as_uri(): 30
    }
    other = [*rows[:29], (29, (0, -1.0, 0, "differs"))]
    write_id_files(tmp_path / "raw2", [rows, other], ["a.parquet", "b.parquet"])
    with pytest.raises(
        InputError,
        match=r"column 'id': id 29 is in both \S+/a\.parquet and "
        r"\S+/b\.parquet \(rows 29 and 29\)",
    ):
        run_reshard(id_config(tmp_path / "raw2", tmp_path / "out2"), dask_client)
    within = [*rows, *rows[:3], (7, (1, -7.0, 0, "differs"))]  # copies, then a clash
    write_id_files(tmp_path / "raw3", [within], ["a.parquet"])
    with pytest.raises(InputError, match=r"id 7 is in \S+/a\.parquet twice \(rows 7 and 33\)"):
        run_reshard(id_config(tmp_path / "raw3", tmp_path / "out3"), dask_client)


def test_across_nights_a_committed_id_stays_unique(tmp_path, dask_client) -> None:
    """The rule across nights: copies are left out within one night, and rows an earlier
    night committed are never dropped, so ids stay unique over the chain. Night 1 (a
    file and its re-sent copy) commits each id once; night 2 re-sending night 1's file
    is refused, naming an id, the file that committed it and `mode: full`; a night 2 of
    new ids amid night 1's, with copies among them, appends, leaving its copies out (night
    1's file and its copy, read again for their ids, do not clash); `mode: full` over
    every file drops the late re-sent file as a copy."""
    rows = [(i, (i % 3, float(i), i % 2, "n1")) for i in range(0, 40, 2)]
    raw, root = tmp_path / "raw", tmp_path / "out"
    write_id_files(raw, [rows, rows], ["a.parquet", "b.parquet"])
    first = run_reshard(id_config(raw, root), dask_client)
    write_id_files(raw, [rows], ["c-resent.parquet"])
    with pytest.raises(InputError) as raised:
        run_reshard(id_config(raw, root), dask_client)
    said = str(raised.value)
    assert re.search(r"column 'id': id \d+ is in both \S+/a\.parquet and \S+/c-resent", said)
    assert "a.parquet an input of an earlier version" in said and "mode: full" in said
    (raw / "c-resent.parquet").unlink()
    new = [(i, (i % 3, float(i), 1, "n2")) for i in range(1, 41, 2)]  # amid night 1's ids
    write_id_files(raw, [new, new[:5]], ["d.parquet", "e.parquet"])
    second = run_reshard(id_config(raw, root), dask_client)
    assert second.manifest.parent_version == first.manifest.version_id
    ids = [i for table in written(second).values() for i in table.column("id").to_pylist()]
    assert sorted(ids) == list(range(40))
    assert main(["verify", str(root)]) == 0
    write_id_files(raw, [rows], ["c-resent.parquet"])
    full = run_reshard(id_config(raw, tmp_path / "full", "full"), dask_client)
    ids = [i for table in written(full).values() for i in table.column("id").to_pylist()]
    assert sorted(ids) == list(range(40))


def test_on_s3_a_resent_file_with_ids_is_dropped_and_a_clash_refused(tmp_path, s3_endpoint) -> None:
    """Invariants, inputs, scratch and version on moto's S3: the check reads the pairs and
    drop lists the run wrote there, so a re-sent file keeping its ids is dropped to its
    first copies (each id once), and a row of new content under a used id is refused."""
    bucket = f"ballast-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("s3")
    fs.mkdir(bucket)
    rows = [(i, (i % 3, float(i), i % 2, "s3")) for i in range(40)]
    other = [*rows[:39], (39, (0, -1.0, 0, "differs"))]
    for name, files in (("ok", [rows, rows]), ("clash", [rows, other])):
        write_id_files(tmp_path / name, files, ["a.parquet", "b.parquet"])
        fs.put(f"{tmp_path / name}/", f"{bucket}/{name}/", recursive=True)
    config = id_config(tmp_path / "ok", tmp_path / "unused")
    dataset = config.dataset.model_copy(update={"inputs": [f"s3://{bucket}/ok/*.parquet"]})
    settings = {"dataset": dataset, "output_root": f"s3://{bucket}/out", "num_workers": 1}
    result = run_reshard(config.model_copy(update=settings))
    ids = [i for table in written(result).values() for i in table.column("id").to_pylist()]
    assert sorted(ids) == list(range(40))
    dataset = dataset.model_copy(update={"inputs": [f"s3://{bucket}/clash/*.parquet"]})
    settings = {**settings, "dataset": dataset, "output_root": f"s3://{bucket}/out2"}
    with pytest.raises(InputError, match=r"id 39 is in both s3://\S+/a\.parquet and "):
        run_reshard(config.model_copy(update=settings))
