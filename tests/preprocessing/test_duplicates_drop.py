"""`dataset.duplicates: drop` end to end on the session cluster: of each set of rows equal
in label and features within a night's inputs, exactly the first by (file as listed, row)
reaches the version, on either route, byte for byte; rows committed by an earlier night
stay; the manifest counts what was dropped."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flows.cli.main import main
from flows.tasks import dropped_copies
from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
from preprocessing.contract.manifest import shard_uri
from preprocessing.driver.reshard import ReshardResult, run_reshard
from preprocessing.plan.row_ids import DERIVED_ID_COLUMN, derived_ids
from preprocessing.synthetic.tabular import SampleSpec, write_sample
from tests.log_records import messages, records_of
from tests.preprocessing.test_kill_scans import config_of, killed_mid_write, zeroed

pytestmark = pytest.mark.slow  # every test here uses the session Dask cluster

FEATURES = ["x", "y", "s"]
FLOATS = st.one_of(st.none(), st.floats(allow_nan=True), st.sampled_from([0.0, -0.0]))
ROWS = st.tuples(
    st.integers(0, 2),
    FLOATS,
    st.one_of(st.none(), st.integers(0, 2)),
    st.sampled_from(["", "é", "a\x00", "a"]),
)


@st.composite
def nights(draw: st.DrawFn) -> list[list[tuple]]:
    """Files of rows: copies within and across files, an empty file at times (rejected),
    and at times a last file made only of copies of earlier rows."""
    base = draw(st.lists(ROWS, min_size=1, max_size=12))
    picks = st.lists(st.integers(0, len(base) - 1), max_size=25)
    files = [[base[i] for i in draw(picks)] for _ in range(draw(st.integers(0, 3)))]
    files.insert(draw(st.integers(0, len(files))), base)  # one file with every content
    if draw(st.booleans()):
        seen = [row for rows in files for row in rows] or base[:1]
        files.append([seen[i] for i in draw(st.lists(st.integers(0, len(seen) - 1), min_size=1))])
    return files


def write_files(raw: Path, files: list[list[tuple]], first: int = 0) -> None:
    """Write `files[first:]` as f<index>.parquet (listed in that order)."""
    raw.mkdir(parents=True, exist_ok=True)
    for index, rows in list(enumerate(files))[first:]:
        columns = list(zip(*rows, strict=True)) if rows else [[], [], [], []]
        table = pa.table(
            {
                "label": pa.array(columns[0], pa.int64()),
                "x": pa.array(columns[1], pa.float64()),
                "y": pa.array(columns[2], pa.int64()),
                "s": pa.array(columns[3], pa.string()),
            }
        )
        pq.write_table(table, raw / f"f{index:02d}.parquet", row_group_size=7)


def reshard_config(raw: Path, root: Path, duplicates: str, budget: int | None) -> ReshardConfig:
    dataset = DatasetSpec(
        inputs=[str(raw)],
        source_column=None,
        feature_columns=FEATURES,
        nulls={"x": "fill_zero", "y": "drop_row"},
        duplicates=duplicates,  # type: ignore[arg-type]
    )
    return ReshardConfig(
        dataset=dataset,
        output_root=str(root),
        target_shard_rows=9,
        holdout_fraction=0.3,
        mix=MixConfig(class_weighting="natural"),  # no resampling: every row once
        max_rejected_fraction=1.0,  # an empty file is rejected, not the run
        max_piece_rows=5,
        seed=7,
        mode="incremental",
        single_pass_bytes=budget,
    )


def content_key(row: tuple) -> tuple:
    """A row's content as the hash reads it: floats by their bits (NaN by its bits, -0.0
    apart from 0.0), a null apart from every value."""
    label, x, y, s = row
    return (label, None if x is None else struct.pack("<d", x), y, s)


def first_copies(files: list[list[tuple]]) -> set[int]:
    """The derived ids of the rows `drop` must keep: of each content, the first by (file,
    row), among rows the scan keeps (`y` null: dropped by its `drop_row` policy)."""
    seen, kept = set(), set()
    for index, rows in enumerate(files):
        ids = derived_ids(f"f{index:02d}.parquet", 0, len(rows)).tolist()
        for row, row_id in zip(rows, ids, strict=True):
            if row[2] is not None and content_key(row) not in seen:
                seen.add(content_key(row))
                kept.add(row_id)
    return kept


def written(result: ReshardResult, version: str | None = None) -> dict[str, pa.Table]:
    """Each split's rows of the version (only those night `version` added, if given)."""
    manifest = result.manifest
    return {
        split: pa.concat_tables(
            pq.read_table(shard_uri(result.manifest_uri, shard))
            for shard in entry.shards
            if version is None or (shard.version or manifest.version_id) == version
        )
        for split, entry in manifest.splits.items()
    }


def digests(result: ReshardResult) -> list[str]:
    return [s.sha256 for split in result.manifest.splits.values() for s in split.shards]


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(files=nights())
def test_exactly_the_first_copy_survives_on_both_routes(
    files: list[list[tuple]], tmp_path_factory, dask_client
) -> None:
    """Invariants, over hostile tables (copies within and across files, NaN, -0.0, nulls,
    empty files, a file of copies only): the rows written are exactly the first of each
    content by (file, row), once each; the staged route and the single pass give the same
    id and byte-identical shards; the delta's `dropped_duplicates` add up to the rows left
    out; `ballast verify` passes."""
    base = tmp_path_factory.mktemp("drop")
    write_files(base / "raw", files)
    expected = first_copies(files)
    results = {}
    for name, budget in (("staged", 0), ("single", None)):
        config = reshard_config(base / "raw", base / name, "drop", budget)
        if not expected:  # nothing reaches a version: refused, naming why
            with pytest.raises(ValueError, match="no training rows"):
                run_reshard(config, dask_client)
            return
        try:
            results[name] = run_reshard(config, dask_client)
        except ValueError as error:  # every content drawn into the holdout
            assert "no training rows" in str(error)
            return
    staged, single = results["staged"], results["single"]
    assert staged.manifest.route["route"] == "staged"
    assert single.manifest.route["route"] == "single_pass"
    assert staged.manifest.version_id == single.manifest.version_id
    assert digests(staged) == digests(single)
    ids = [i for t in written(staged).values() for i in t.column(DERIVED_ID_COLUMN).to_pylist()]
    assert Counter(ids) == Counter(expected)
    values = staged.manifest.deltas[-1].split_values
    kept_rows = sum(1 for rows in files for row in rows if row[2] is not None)
    assert sum(v["dropped_duplicates"] for v in values.values()) == kept_rows - len(expected)
    assert main(["verify", str(base / "staged")]) == 0


def night_rows(rng: np.random.Generator, night: int, rows: int) -> list[tuple]:
    """A night's rows: a third of them copies of others of the same night."""
    fresh = [
        (int(rng.integers(0, 3)), float(night * 1000 + i), int(rng.integers(0, 3)), "n")
        for i in range(rows - rows // 3)
    ]
    return fresh + [fresh[int(i)] for i in rng.integers(0, len(fresh), size=rows // 3)]


def test_a_resent_file_is_dropped_within_its_night_only(tmp_path, dask_client) -> None:
    """Invariants, over a base and two nights of a chain (the last re-sends the first
    night's file under a new name and copies it twice more): within each night's own
    rows no content appears twice; a row an earlier night committed is not dropped (the
    re-sent rows stay once in their new night); every copy of a content in the chain
    sits in one split; each delta counts what its night dropped; verify passes."""
    rng = np.random.default_rng(3)
    raw, root = tmp_path / "raw", tmp_path / "out"
    nights = [[night_rows(rng, 0, 60), night_rows(rng, 0, 30)], [night_rows(rng, 1, 45)]]
    nights.append([nights[1][0], nights[1][0][:20], night_rows(rng, 2, 30)])
    results, files = [], []
    for night, parts in enumerate(nights):
        files += parts
        write_files(raw, files, len(files) - len(parts))
        results.append(run_reshard(reshard_config(raw, root, "drop", None), dask_client))
        parent = results[-2].manifest.version_id if night else None
        assert results[-1].manifest.parent_version == parent
    last = results[-1]
    sides: dict[tuple, set[str]] = {}
    for result, parts in zip(results, nights, strict=True):
        own = written(last, result.manifest.version_id)
        contents: Counter[tuple] = Counter()
        for split, table in own.items():
            for row in zip(
                *(table.column(c).to_pylist() for c in ["label", *FEATURES]), strict=True
            ):
                sides.setdefault(row, set()).add(split)
                contents[row] += 1
        assert max(contents.values()) == 1
        distinct = {content_key(row) for rows in parts for row in rows}
        assert sum(contents.values()) == len(distinct)
        delta = result.manifest.deltas[-1].split_values
        rows_in = sum(len(rows) for rows in parts)
        assert sum(v["dropped_duplicates"] for v in delta.values()) == rows_in - len(distinct)
        assert dropped_copies(result.manifest) == rows_in - len(distinct)  # --output json's
    resent = set(nights[1][0])
    assert all(len(sides[row]) == 1 for row in resent)  # one split, twice in the chain
    assert main(["verify", str(root)]) == 0


def test_verify_names_a_content_kept_twice_in_a_night_under_drop(
    tmp_path, dask_client, capsys
) -> None:
    """Invariant: `ballast verify` of a version whose settings say `drop` names a content
    that two rows of one night hold (exit 1), with the two shards; the same shards under
    `same_split`, which keeps copies, pass."""
    rows = night_rows(np.random.default_rng(4), 0, 40)
    write_files(tmp_path / "raw", [rows, rows[:10]])
    root = tmp_path / "out"
    result = run_reshard(reshard_config(tmp_path / "raw", root, "same_split", None), dask_client)
    assert main(["verify", str(root)]) == 0
    capsys.readouterr()
    location = Path(result.manifest_uri)
    document = json.loads(location.read_text())
    document["config"]["dataset"]["duplicates"] = "drop"  # a version that broke its promise
    location.write_text(json.dumps(document))
    assert main(["verify", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"LEAK version {result.manifest.version_id}: duplicate content {{'label'" in out
    assert "kept twice in one night under duplicates: drop" in out


def test_a_rerun_of_a_killed_drop_keeps_its_scans_pairs_and_shards(tmp_path, dask_client) -> None:
    """Invariants: a reshard under `drop` (one file re-sent under a new name) killed
    mid-write, its inputs then zeroed, is resumed from its dead attempt's scans and the
    pairs they wrote into it (no input read again), and commits the clean run's shards,
    having dropped the same rows."""
    raw = tmp_path / "raw"
    write_sample(raw, SampleSpec(num_rows=60_000, num_files=4, seed=13))
    shutil.copyfile(raw / sorted(os.listdir(raw))[0], raw / "zz-resent.parquet")

    def dropping(root: Path) -> ReshardConfig:  # test_kill_scans' staged route, under drop
        config = config_of(raw, root)
        dataset = config.dataset.model_copy(update={"duplicates": "drop"})
        return config.model_copy(update={"dataset": dataset})

    clean = run_reshard(dropping(tmp_path / "clean"), dask_client)
    dropped = dropped_copies(clean.manifest)
    assert dropped == pq.ParquetFile(raw / "zz-resent.parquet").metadata.num_rows
    config = dropping(tmp_path / "out")
    killed_mid_write(config, tmp_path)
    with zeroed(sorted(raw.glob("*.parquet"))), records_of("preprocessing") as logged:
        rerun = run_reshard(config, dask_client)
    assert "scan kept: the scans of 5 input files" in messages(logged).splitlines()
    assert digests(rerun) == digests(clean) and dropped_copies(rerun.manifest) == dropped
