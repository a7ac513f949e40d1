"""The Delta Lake table of a root (preprocessing/versions/table.py) read by engines that know
nothing of ballast, and `ballast files`: on an incremental chain of three versions and
after a rollback, each returns exactly the manifest's rows per split and class; a crash
between `_CURRENT` and the table commit, and racing publishers, leave them in step."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from flows.cli.main import main as ballast
from preprocessing.contract.commit import KILL_AT_ENV, CommitConflict, swap_current
from preprocessing.contract.manifest import (
    SplitEntry,
    read_current_version,
    read_manifest,
    shard_name,
    shard_uri,
)
from preprocessing.contract.shards import write_shard
from preprocessing.driver.reshard import run_reshard
from preprocessing.synthetic.tabular import write_sample
from preprocessing.versions.attempt import VersionAttempt
from preprocessing.versions.rollback import rollback_dataset
from preprocessing.versions.table import (
    SPLIT_COLUMN,
    VERSION_KEY,
    _commit,
    publish_current,
    read_head,
)
from tests.log_records import messages, records_of
from tests.preprocessing.nightly import SPEC, add_night, config_for
from tests.preprocessing.table_readers import check_every_reader, expected_counts
from tests.preprocessing.version_writer import manifest_of, write_test_shard

REPO = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("version_writer.py")


@dataclass(frozen=True)
class Chain:
    root: Path
    version_ids: list[str]  # the base, then one child per night


@pytest.fixture(scope="module")
def chain(tmp_path_factory, dask_client) -> Chain:
    """A flat version of 10 files, then two nightly children: a chain of three versions."""
    base = tmp_path_factory.mktemp("table")
    raw, root = base / "raw", base / "out"
    write_sample(raw, SPEC)
    ids = [run_reshard(config_for(raw, root), dask_client).manifest.version_id]
    for night in range(2):
        add_night(raw, night)
        ids.append(run_reshard(config_for(raw, root), dask_client).manifest.version_id)
    return Chain(root, ids)


def listed(root: Path, capsys, *flags: str) -> list[str]:
    """What `ballast files ROOT FLAGS` printed, a URI a line."""
    assert ballast(["files", str(root), *flags]) == 0
    return capsys.readouterr().out.split()


def check_readers(root: Path, version_id: str, capsys) -> None:
    """Every engine on the table (tests/preprocessing/table_readers.py), and `ballast
    files`, against the manifest."""
    manifest, location = read_manifest(str(root))
    assert manifest.version_id == version_id and read_current_version(str(root)) == version_id
    expected, label = expected_counts(manifest), manifest.label_column
    table = DeltaTable(str(root))
    assert table.history(1)[0][VERSION_KEY] == version_id
    check_every_reader(str(root))
    for split, entries in manifest.splits.items():
        uris = [shard_uri(location, entry) for entry in entries.shards]
        assert listed(root, capsys, "--split", split) == uris
        in_table = table.to_pyarrow_table(filters=[(SPLIT_COLUMN, "=", split)])
        assert in_table.num_rows == entries.num_rows
        assert Counter(map(str, pl.scan_parquet(uris).collect()[label])) == expected[split]
    assert sorted(table.file_uris()) == sorted(listed(root, capsys))


@pytest.mark.slow  # reshards on the session's Dask cluster
def test_a_chain_and_its_rollback_read_the_same_rows_in_every_engine(chain: Chain, capsys) -> None:
    """Invariants: after the third version of a chain the table's newest version, every
    engine (deltalake, Polars' own reader and through pyarrow, Daft) and `ballast files`
    hold exactly the manifest's rows per split and class, the
    children's ancestors' shards in place; a rollback is a new table version holding the
    version rolled back to (the middle one, then the flat one), and the table's history
    names each ballast version in order."""
    root, ids = chain.root, chain.version_ids
    check_readers(root, ids[-1], capsys)
    assert listed(root, capsys, "--version", ids[0]) == [
        shard_uri(read_manifest(str(root / f"v-{ids[0]}"))[1], entry)
        for split in read_manifest(str(root / f"v-{ids[0]}"))[0].splits.values()
        for entry in split.shards
    ]
    rollback_dataset(str(root), ids[1])
    check_readers(root, ids[1], capsys)
    rollback_dataset(str(root), ids[0])  # the flat version
    check_readers(root, ids[0], capsys)
    history = [h[VERSION_KEY] for h in reversed(DeltaTable(str(root)).history())]
    assert history == [*ids, ids[1], ids[0]]


def write_version(root: Path, version_id: str) -> None:
    """A tiny version committed in this process (tests/preprocessing/version_writer.py)."""
    previous = read_current_version(str(root))
    with VersionAttempt(str(root), version_id) as attempt:
        entries = [
            write_test_shard(attempt.shard_uri(shard_name("train", index)), version_id, index)
            for index in range(2)
        ]
        attempt.commit(manifest_of(version_id, entries), expected=previous)


def head_version(root: Path) -> str | None:
    head = read_head(str(root))
    return None if head is None else head.version_id


@pytest.mark.slow  # the writer runs as its own process, SIGKILLed mid-commit
@pytest.mark.parametrize("step", ["manifest", "swap"])
def test_a_crash_between_current_and_the_table_is_repaired_by_the_rerun(tmp_path, step) -> None:
    """Invariants: killed after the manifest or after `_CURRENT` moved, the table still
    holds the old version (never one `_CURRENT` did not name); the rerun brings the table
    to the new version in one table commit."""
    write_version(tmp_path, "old")
    env = {"PYTHONPATH": str(REPO), KILL_AT_ENV: step}
    killed = subprocess.run(
        [sys.executable, str(WRITER), str(tmp_path), "new"], env={**os.environ, **env}, timeout=120
    )
    assert killed.returncode == -9
    assert head_version(tmp_path) == "old"
    rerun = subprocess.run(
        [sys.executable, str(WRITER), str(tmp_path), "new"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert read_current_version(str(tmp_path)) == head_version(tmp_path) == "new"
    assert DeltaTable(str(tmp_path)).version() == 1


def test_a_publisher_that_loses_the_table_commit_converges_on_current(tmp_path) -> None:
    """Invariants: of two publishers that read the same table head, the second's commit
    fails (no retry on a stale head) and its next look finds the table in step with
    `_CURRENT`; the table never gets a version `_CURRENT` does not name."""
    write_version(tmp_path, "a")
    write_version(tmp_path, "b")
    rollback_dataset(str(tmp_path), "a")
    stale = read_head(str(tmp_path))
    assert stale is not None and stale.version_id == "a"
    write_version(tmp_path, "c")  # moves `_CURRENT`, then publishes c on top of `stale`
    manifest = read_manifest(str(tmp_path / "v-a"))[0]
    with pytest.raises(Exception, match="Failed to commit"):
        _commit(str(tmp_path), manifest, stale)
    assert publish_current(str(tmp_path)) == 3 and head_version(tmp_path) == "c"
    history = [h[VERSION_KEY] for h in reversed(DeltaTable(str(tmp_path)).history())]
    assert history == ["a", "b", "a", "c"]


def test_a_rollback_cut_off_before_its_table_commit_is_finished_by_running_it_again(
    tmp_path,
) -> None:
    """Invariants: `_CURRENT` moved back by hand (a rollback killed before publishing)
    leaves the table on the newer version; `ballast rollback` to the same version then
    publishes it as a new table version and changes nothing else."""
    write_version(tmp_path, "a")
    write_version(tmp_path, "b")
    swap_current(str(tmp_path), "a", expected="b")
    assert head_version(tmp_path) == "b"
    assert "nothing to do" in rollback_dataset(str(tmp_path), "a")
    assert head_version(tmp_path) == "a" and DeltaTable(str(tmp_path)).version() == 2
    assert sorted(DeltaTable(str(tmp_path)).file_uris()) == sorted(
        str(tmp_path / "v-a" / shard_name("train", index)) for index in range(2)
    )


def test_a_schema_delta_lake_cannot_hold_is_named_and_never_fails_the_commit(
    tmp_path,
) -> None:
    """Invariants: shard columns Delta Lake cannot hold (a time64 column; names equal but for
    case, as real tables have) are named in a warning; the version itself is committed and
    current, and no table is written: the table is a view, never a reason a run fails."""
    tables = {
        "timed": ({"at": pa.array([1, 2], pa.time64("us"))}, r"column 'at' of type time64"),
        "cased": ({"mass": [1.0, 2.0], "Mass": [3.0, 4.0]}, r"no Delta Lake schema"),
    }
    for version_id, (columns, named) in tables.items():
        root = tmp_path / version_id
        rows = pa.table(
            {"id": pa.array([1, 2], pa.int64()), "label": pa.array([0, 1], pa.int64()), **columns}
        )
        warned = records_of("preprocessing", logging.WARNING)
        with warned as logged, VersionAttempt(str(root), version_id) as attempt:
            entry = write_shard(attempt.shard_uri(shard_name("train", 0)), rows, 2, "label")
            attempt.commit(manifest_of(version_id, [entry]), expected=None)
        assert re.search(named, messages(logged)), messages(logged)
        assert read_current_version(str(root)) == version_id and read_head(str(root)) is None


def test_a_commit_that_loses_the_swap_leaves_the_table_on_the_winner(tmp_path) -> None:
    """Invariants: a commit whose expected `_CURRENT` is stale raises CommitConflict and
    commits no table version: `_CURRENT` and the table both stay on the winner."""
    write_version(tmp_path, "winner")
    with pytest.raises(CommitConflict), VersionAttempt(str(tmp_path), "loser") as attempt:
        entries = [write_test_shard(attempt.shard_uri(shard_name("train", 0)), "loser", 0)]
        attempt.commit(manifest_of("loser", entries), expected=None)
    assert read_current_version(str(tmp_path)) == head_version(tmp_path) == "winner"
    assert DeltaTable(str(tmp_path)).version() == 0


def test_a_version_of_format_2_stays_readable_and_verifiable(tmp_path, capsys) -> None:
    """Invariants: a version written before format 3 (shards flat in the version
    directory, `format_version: 2`) is read, listed and verified as before, and its table
    is published with the paths it has (deltalake reads its rows per split)."""
    with VersionAttempt(str(tmp_path), "old") as attempt:
        entries = [
            write_test_shard(attempt.shard_uri(f"train-{index:05d}.parquet"), "old", index)
            for index in range(2)
        ]
        attempt.commit(replace(manifest_of("old", entries), format_version=2), expected=None)
    manifest, location = read_manifest(str(tmp_path))
    assert manifest.format_version == 2 and entries[0].path == "train-00000.parquet"
    uris = [shard_uri(location, entry) for entry in entries]
    assert listed(tmp_path, capsys) == uris == sorted(DeltaTable(str(tmp_path)).file_uris())
    assert ballast(["verify", str(tmp_path)]) == 0
    rows = DeltaTable(str(tmp_path)).to_pyarrow_table(filters=[(SPLIT_COLUMN, "=", "train")])
    assert rows.num_rows == manifest.split("train").num_rows


@pytest.mark.slow  # reshards on the session's Dask cluster
def test_an_incremental_run_on_a_format_2_parent_is_a_full_reshard(tmp_path, dask_client) -> None:
    """Invariants: a child lists its ancestors' shards in place, so a `mode: incremental`
    run whose current version is of format 2 makes a flat version of format 3 instead
    (its reason says so), which every engine reads natively."""
    raw, root = tmp_path / "raw", tmp_path / "out"
    write_sample(raw, SPEC)
    first = run_reshard(config_for(raw, root), dask_client).manifest
    path = root / f"v-{first.version_id}" / "_MANIFEST.json"
    path.write_text(replace(first, format_version=2).to_json())  # as an older ballast wrote
    add_night(raw, 0)
    result = run_reshard(config_for(raw, root), dask_client)
    assert "reformat" in result.how and "full reshard" in result.how, result.how
    assert result.manifest.parent_version is None and result.manifest.format_version == 3
    check_every_reader(str(root))


def test_strings_nulls_and_vectors_read_the_same_in_every_engine(tmp_path) -> None:
    """Invariants on a shape no generator of ours makes: string labels with a null class,
    a string column with nulls, a dictionary-encoded column and a vector column, in three
    splits (train, holdout, validation); every engine reads exactly the manifest's rows
    per split and class, the vectors at their
    width, and each file holds exactly the table's types."""
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(range(24), pa.float32()), 3)
    colours = pa.array(["red", None, "blue", "red", None, "green", "blue", "red"])
    rows = pa.table(
        {
            "id": pa.array(range(8), pa.int64()),
            "label": pa.array(["cat", "dog", None, "cat", "dog", "cat", None, "emu"]),
            "colour": colours,
            "size": colours.dictionary_encode(),
            "features": vectors,
        }
    )
    schema = [{"name": f.name, "type": str(f.type)} for f in rows.schema]
    with VersionAttempt(str(tmp_path), "mixed") as attempt:
        entries = {
            split: write_shard(attempt.shard_uri(shard_name(split, 0)), part, 4, "label")
            for split, part in (
                ("train", rows.slice(0, 5)),
                ("holdout", rows.slice(5, 2)),
                ("validation", rows.slice(7)),
            )
        }
        manifest = replace(
            manifest_of("mixed", [entries["train"]]),
            arrow_schema=schema,
            splits={s: SplitEntry(e.num_rows, [e]) for s, e in entries.items()},
        )
        attempt.commit(manifest, expected=None)
    check_every_reader(str(tmp_path))
