"""The manifest's duplicate counts per split under `group_column` + `duplicates:
same_split`, whose content hash the exchange takes (plan/key_tally.py
`exchange_content_tally`) instead of the scan: for any table, files, pieces, seed and
fractions they are the figures of a scan that hashed every row's content (the tally
before this change, written here from its definition), exactly below the sample's size
and the same estimate past it; the map tasks, a rerun's tally of the map tasks it kept
and the single pass give the same."""

from __future__ import annotations

import tempfile
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
from preprocessing.driver import reshard
from preprocessing.driver.reshard import run_reshard
from preprocessing.exchange import tasks as exchange
from preprocessing.exchange.staged_rows import (
    Destinations,
    PieceTask,
    content_tally,
    read_piece,
    staged_schema,
)
from preprocessing.plan.key_tally import (
    SAMPLE,
    KeyCounts,
    exchange_content_tally,
    merge_keys,
    split_value_stats,
    tally_keys,
)
from preprocessing.plan.split_keys import content_in_map, key_columns, key_hashes
from preprocessing.plan.validation_split import splits_of
from preprocessing.scan.across_files import check_schemas
from preprocessing.scan.inputs import FileScan, scan_file
from preprocessing.scan.kept_rows import kept_rows
from preprocessing.storage.sources import InputFile
from tests.preprocessing.test_resume_retry import ClusterLost, digests, wait_idle
from tests.preprocessing.test_split_chain import patients
from tests.preprocessing.test_split_keys import tables


def grouped_spec(raw: str, validation: float) -> DatasetSpec:
    return DatasetSpec(
        inputs=[raw],
        source_column=None,
        feature_columns=["x", "v", "w"],
        group_column="group",
        duplicates="same_split",
        nulls={"x": "drop_row"},
        validation_fraction=validation,
    )


def scanned_tally(path: Path, spec: DatasetSpec, seed: int, fraction: float) -> KeyCounts:
    """The tally of one file as the scan took it before: every row's group and content
    hashed, split, the rows the scan keeps counted (batches merge exactly: one batch)."""
    table = pq.read_table(path)
    keys = key_hashes(table, spec, tally=True)
    splits = splits_of(keys, spec, path.name, 0, table.num_rows, seed, fraction)
    kept = kept_rows(table, spec).kept
    return tally_keys({kind: hashes[kept] for kind, hashes in keys.items()}, splits[kept])


def written_files(folder: Path, table: pa.Table, cuts: list[int]) -> list[InputFile]:
    """`table` as Parquet files cut at `cuts`, row groups of 3 rows (pieces)."""
    files = []
    for index, (start, stop) in enumerate(pairwise([0, *cuts, table.num_rows])):
        if stop > start:
            path = folder / f"f{index}.parquet"
            pq.write_table(table.slice(start, stop - start), path, row_group_size=3)
            files.append(InputFile(str(path), str(folder), path.name, path.stat().st_size, "t"))
    return files


def piece_tallies(scan: FileScan, destinations: Destinations, spec, seed, fraction) -> KeyCounts:
    """The content tally the exchange takes of a file, piece by piece as it reads them."""
    parts, first = [], 0
    for index, rows in enumerate(scan.piece_rows):
        task = PieceTask(index, scan.file, first, rows)
        parts.append(read_piece(task, destinations, spec, seed, fraction)[2])
        first += rows
    return merge_keys(parts)


@settings(max_examples=40, deadline=None)
@given(tables(), st.integers(0, 2**32), st.floats(0.01, 0.9), st.sampled_from([0.0, 0.3]))
def test_the_exchange_tally_is_the_scans_for_any_table_and_pieces(
    drawn, seed, fraction, validation
):
    """Invariant: the scan's group tallies merged with the exchange's content tallies of
    every piece equal, array for array and in the manifest's figures, the tally of a
    scan that hashed every row's content; the scan reads no feature column for it."""
    table, cuts = drawn
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        spec = grouped_spec(directory, validation)
        assert content_in_map(spec) and key_columns(spec) == ["group"]
        files = written_files(folder, table, cuts)
        scans = [scan_file(file, spec, seed, fraction, 3) for file in files]
        accepted = [scan for scan in scans if scan.reason is None]
        assert all(name.endswith("/group") for scan in accepted for name in scan.keys)
        if not accepted:  # every file held a null vector (rejected): nothing is tallied
            return
        before = merge_keys(
            [scanned_tally(Path(s.file.uri), spec, seed, fraction) for s in accepted]
        )
        config = ReshardConfig(dataset=spec, output_root=f"{directory}-out")  # for its schema
        schema = staged_schema(reshard._output_schema(scans, config))
        destinations = Destinations({}, {}, 0, schema)
        now = merge_keys(
            [scan.keys for scan in accepted]
            + [piece_tallies(scan, destinations, spec, seed, fraction) for scan in accepted]
        )
    assert sorted(now) == sorted(before)
    for name in before:
        assert all(np.array_equal(a, b) for a, b in zip(now[name], before[name], strict=True))
    assert split_value_stats(now) == split_value_stats(before)


def test_past_its_sample_the_pieces_give_the_same_estimate() -> None:
    """Invariant: past SAMPLE distinct contents a split's figures are estimates; the
    exchange's tallies of any cut into pieces merge to the very sample of the whole, so
    to the same estimate, `estimated_from` included."""
    rng = np.random.default_rng(4)
    contents = rng.integers(0, 15_000, size=40_000)
    table = pa.table(
        {
            "group": contents % 977,
            "label": contents % 3,
            "x": contents.astype(np.float64),
            "v": pa.array([[float(c), 1.0] for c in contents], pa.list_(pa.float64(), 2)),
            "w": pa.array([[c] for c in contents.tolist()]),
        }
    )
    spec = grouped_spec("raw", 0.2)
    splits = rng.integers(0, 3, size=table.num_rows).astype(np.int8)
    whole = exchange_content_tally(table, spec, splits)
    cuts = np.unique(np.r_[0, rng.integers(0, table.num_rows, size=60), table.num_rows])
    parts = [
        exchange_content_tally(table.slice(a, b - a), spec, splits[a:b]) for a, b in pairwise(cuts)
    ]
    merged = merge_keys(parts)
    stats = split_value_stats(merged)
    assert all(entry["estimated_from"] == SAMPLE for entry in stats.values())
    assert stats == split_value_stats(whole)
    for name in whole:
        assert np.array_equal(merged[name][0], whole[name][0])
        assert np.array_equal(merged[name][1], whole[name][1])


def test_a_rerun_tallies_the_map_tasks_it_kept_as_they_tallied() -> None:
    """Invariant: `content_tally` (what a rerun takes of a map task whose staged object it
    kept) is the tally `map_pieces` returned for that task, and the map tasks' tallies
    with the scans' give the figures of a scan that hashed the content."""
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 60, size=900)
    table = pa.table(
        {
            "group": [f"g{i % 40}" for i in ids],
            "label": (ids % 3).tolist(),
            "x": (ids % 7).astype(np.float64),
            "v": pa.array([[float(i % 5)] * 4 for i in ids], pa.list_(pa.float32(), 4)),
            "w": pa.array([[int(i % 2)] for i in ids]),
        }
    )
    with tempfile.TemporaryDirectory() as directory:
        folder = Path(directory)
        (folder / "raw").mkdir()
        written_files(folder / "raw", table, [200, 350, 700])
        spec = grouped_spec(str(folder / "raw"), 0.2)
        config = ReshardConfig(
            dataset=spec,
            output_root=str(folder / "out"),
            target_shard_rows=100,
            holdout_fraction=0.25,
            mix=MixConfig(class_weighting="uniform"),
            exchange_task_bytes=4_000,
            seed=5,
        )
        files = [
            InputFile(str(p), str(folder / "raw"), p.name, p.stat().st_size, "t")
            for p in sorted((folder / "raw").glob("*.parquet"))
        ]
        scans = check_schemas([scan_file(f, spec, 5, 0.25, config.max_piece_rows) for f in files])
        schema = reshard._output_schema(scans, config)
        plans, pieces = reshard._plan(scans, config)
        destinations = exchange.destinations_for(plans, schema)
        layout = exchange.exchange_layout(scans, plans, pieces, config, threads=1)
        assert layout.num_map_tasks > 2
        staging = exchange.Staging(str(folder / "exchange"), layout, destinations.schema)
        first_rows = exchange.piece_rows(scans, pieces)[0]
        mapped, again = [], []
        for task in range(layout.num_map_tasks):
            described = exchange.map_task(scans, plans, pieces, first_rows, staging, task)
            mapped.append(exchange.map_pieces(described, destinations, spec, 5, 0.25)[1])
            again.append(content_tally(described.pieces, destinations, spec, 5, 0.25))
        before = [scanned_tally(Path(f.uri), spec, 5, 0.25) for f in files]
    for ran, kept in zip(mapped, again, strict=True):
        assert sorted(ran) == sorted(kept)
        assert all(np.array_equal(a, b) for n in ran for a, b in zip(ran[n], kept[n], strict=True))
    now = merge_keys([scan.keys for scan in scans] + mapped)
    assert split_value_stats(now) == split_value_stats(merge_keys(before))
    assert split_value_stats(now)["train"]["duplicate_rows"] > 0


@pytest.mark.slow  # the session Dask cluster (two worker processes)
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tables(), st.integers(0, 2**32))
def test_each_route_records_the_figures_of_a_scan_that_hashed_the_content(dask_client, drawn, seed):
    """Invariant: through the real reshard, the version's `split_values` (rows, groups,
    largest group's share, duplicate rows per split) are those of a scan that hashed every
    row's content, on the staged route (many map tasks) and on the single pass alike, for
    a first version and for a child of the chain that adds a file."""
    table, cuts = drawn
    table = table.drop_columns(["w"])  # a null vector rejects its file: none here
    with tempfile.TemporaryDirectory() as directory:
        raw = Path(directory) / "raw"
        raw.mkdir()
        spec = grouped_spec(str(raw), 0.2).model_copy(update={"feature_columns": ["x", "v"]})
        nights = [written_files(raw, table, cuts)]
        resent = table.slice(table.num_rows // 2)  # re-sent under a new name, the next night
        pq.write_table(resent, raw / "late.parquet", row_group_size=3)
        nights.append([InputFile(str(raw / "late.parquet"), str(raw), "late.parquet", 1, "t")])
        (raw / "late.parquet").rename(raw / "late.later")  # listed from the second night
        for night, files in enumerate(nights):
            if night:
                (raw / "late.later").rename(raw / "late.parquet")
            before = split_value_stats(
                merge_keys([scanned_tally(Path(f.uri), spec, seed % 1000, 0.3) for f in files])
            )
            assume(before["train"]["rows"] > 0)  # else no version to make (refused)
            for route, budget in (("staged", 0), ("single_pass", None)):
                config = routed_config(spec, Path(directory) / route, seed, budget)
                result = run_reshard(config, dask_client)
                assert result.manifest.route["route"] == route
                assert result.manifest.deltas[-1].split_values == before


def routed_config(spec: DatasetSpec, root: Path, seed: int, budget: int | None) -> ReshardConfig:
    """Small tasks (many map tasks on the staged route), the single pass by default;
    `budget`: 0 forces the staged route."""
    return ReshardConfig(
        dataset=spec,
        output_root=str(root),
        target_shard_rows=7,
        holdout_fraction=0.3,
        exchange_task_bytes=1_000,
        max_piece_rows=4,
        mode="incremental",
        seed=seed % 1000,
        single_pass_bytes=budget,
    )


@pytest.mark.slow  # the session Dask cluster (two worker processes)
def test_a_retry_that_kept_map_outputs_records_a_clean_runs_figures(
    tmp_path: Path, dask_client
) -> None:
    """Invariant: a run failing halfway through its map tasks keeps their staged objects;
    the retry that takes them over tallies those tasks' content again, so its manifest's
    `split_values` are a clean run's (and its shards, as ever)."""
    rng = np.random.default_rng(3)
    raw = tmp_path / "raw"
    raw.mkdir()
    for night in range(4):
        pq.write_table(patients(rng, 100 * night, 100, 0), raw / f"{night}.parquet")
    dataset = DatasetSpec(
        inputs=[str(raw)],
        source_column=None,
        feature_columns=["x", "y"],
        group_column="patient",
        duplicates="same_split",
        validation_fraction=0.2,
    )
    config = ReshardConfig(
        dataset=dataset,
        output_root=str(tmp_path / "out"),
        target_shard_rows=300,
        holdout_fraction=0.2,
        exchange_task_bytes=4_000,
        max_piece_rows=200,
        max_tasks_in_flight=2,  # so that map tasks are left to run when the run fails
        single_pass_bytes=0,  # the staged route's resume
    )
    with pytest.raises(ClusterLost):
        run_reshard(config, dask_client, progress=fail_in("exchange", ClusterLost("lost")))
    wait_idle(dask_client)
    retry = run_reshard(config, dask_client)
    clean = run_reshard(
        config.model_copy(update={"output_root": str(tmp_path / "clean")}), dask_client
    )
    assert retry.manifest.resumed["map_outputs_kept"] > 0, retry.manifest.resumed
    assert retry.manifest.deltas[-1].split_values == clean.manifest.deltas[-1].split_values
    assert clean.manifest.deltas[-1].split_values["train"]["duplicate_rows"] > 0
    assert digests(retry) == digests(clean)


def fail_in(stage: str, error: Exception):
    """A progress callback raising `error` once half of `stage`'s tasks are done."""

    def progress(name: str, done: int, total: int) -> None:
        if name == stage and done * 2 >= total:
            raise error

    return progress
