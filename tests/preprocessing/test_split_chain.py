"""Splits by value through the real reshard (Dask LocalCluster): patients of about 8 rows
and rows re-delivered in other files, a base version and nightly children. With
`group_column` and `duplicates: same_split` no patient and no duplicate content crosses
splits (train, holdout, validation) in any version of the chain, `ballast verify`'s check
finds nothing, and the manifest records each night's groups and duplicates; the row-wise
split of the same rows leaks, and the check names it. Under a time holdout each night
holds out its newest rows, on both routes alike, and the check names a row across a
night's cut."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.cli.main import main
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri, version_dir
from preprocessing.driver.reshard import ReshardResult, run_reshard
from preprocessing.versions.split_leaks import find_leaks, split_leaks

pytestmark = pytest.mark.slow  # every test here uses the session Dask cluster

FEATURES = ["x", "y"]


def patients(rng: np.random.Generator, first: int, count: int, night: int) -> pa.Table:
    """About 8 rows for each of `count` patients numbered from `first` (some patients of
    earlier nights come back), then 6% of the rows re-delivered (copied as they were)."""
    ids = rng.integers(max(0, first - 20), first + count, size=8 * count)
    table = pa.table(
        {
            "patient": [f"p{i}" for i in ids],
            "label": (ids % 3).tolist(),
            "x": np.round(rng.normal(size=len(ids)), 2),
            "y": rng.integers(0, 4, size=len(ids)).astype(np.float64),
            "night": np.full(len(ids), night),
        }
    )
    again = rng.choice(table.num_rows, size=table.num_rows * 6 // 100, replace=False)
    return pa.concat_tables([table, table.take(pa.array(again))])


def config(raw: Path, root: Path, group: bool) -> ReshardConfig:
    dataset = DatasetSpec(
        inputs=[str(raw)],
        source_column=None,
        feature_columns=FEATURES,
        group_column="patient" if group else None,
        duplicates="same_split" if group else "keep",
        validation_fraction=0.2,
    )
    return ReshardConfig(
        dataset=dataset,
        output_root=str(root),
        target_shard_rows=200,
        holdout_fraction=0.2,
        mode="incremental",
        seed=11,
    )


def run_chain(base: Path, group: bool, dask_client) -> tuple[Path, list[ReshardResult]]:
    """A base of two files, then three nights each adding one file (the last re-sends a
    slice of the first night's file under a new name)."""
    rng = np.random.default_rng(5)
    raw, root = base / "raw", base / "out"
    raw.mkdir()
    pq.write_table(patients(rng, 0, 40, 0), raw / "a.parquet", row_group_size=100)
    pq.write_table(patients(rng, 40, 40, 0), raw / "b.parquet", row_group_size=100)
    results = [run_reshard(config(raw, root, group), dask_client)]
    for night in range(1, 4):
        table = patients(rng, 40 + 30 * night, 30, night)
        if night == 3:
            table = pa.concat_tables([table, pq.read_table(raw / "a.parquet").slice(0, 40)])
        pq.write_table(table, raw / f"night-{night}.parquet", row_group_size=100)
        results.append(run_reshard(config(raw, root, group), dask_client))
    return root, results


def sides_of(result: ReshardResult, columns: list[str]) -> dict[tuple, set[str]]:
    """Each key (the values of `columns`) of a version, with the splits it has rows in."""
    sides: dict[tuple, set[str]] = defaultdict(set)
    for split, entry in result.manifest.splits.items():
        for shard in entry.shards:
            rows = pq.read_table(shard_uri(result.manifest_uri, shard), columns=columns)
            for row in zip(*(rows.column(c).to_pylist() for c in columns), strict=True):
                sides[row].add(split)
    return sides


@pytest.fixture(scope="module")
def grouped(tmp_path_factory, dask_client) -> tuple[Path, list[ReshardResult]]:
    return run_chain(tmp_path_factory.mktemp("grouped"), True, dask_client)


def test_no_patient_and_no_duplicate_crosses_splits_in_any_version(grouped) -> None:
    """Invariant: in the base and in every child (each listing its whole chain), every
    patient and every duplicate content has rows in one split only; so a patient first
    held out stays held out every later night, and one in train stays in train."""
    _, results = grouped
    assert [len(r.manifest.deltas) for r in results] == [1, 2, 3, 4]
    for result in results:
        for columns in (["patient"], ["label", *FEATURES, "patient"]):
            crossing = [key for key, seen in sides_of(result, columns).items() if len(seen) > 1]
            assert crossing == [], (result.manifest.version_id, columns, crossing[:3])
        assert {"train", "holdout", "validation"} <= set(result.manifest.splits)


def test_verify_finds_no_leak_and_the_manifest_records_each_night(grouped) -> None:
    """Invariant: the check `ballast verify` runs finds no leak in the chain; each
    night's delta records per split its rows, groups, the largest group's share and the
    duplicate input rows, and the held-out and validation shares of rows are near the
    fractions asked."""
    root, results = grouped
    assert split_leaks(str(root)) == []
    for delta in results[-1].manifest.deltas:
        stats = delta.split_values
        assert stats["train"]["groups"] > 0 and stats["holdout"]["groups"] > 0
        assert 0 < stats["train"]["largest_group_share"] < 1
        assert stats["train"]["duplicate_rows"] + stats["holdout"]["duplicate_rows"] > 0
        rows = sum(stats[split]["rows"] for split in ("train", "holdout", "validation"))
        for split in ("holdout", "validation"):
            assert stats[split]["groups"] > 0 and 0.03 < stats[split]["rows"] / rows < 0.45


def test_row_wise_split_of_the_same_rows_leaks_and_the_check_names_it(
    tmp_path, dask_client
) -> None:
    """Invariant: without the settings the same rows leak (patients on both sides), the
    version promises nothing so `split_leaks` is silent, and the check asked for the
    patients names a leaking patient and the shards holding it on each side."""
    root, results = run_chain(tmp_path, False, dask_client)
    manifest, location = read_manifest(version_dir(str(root), results[-1].manifest.version_id))
    assert split_leaks(str(root)) == []
    leaks = find_leaks(manifest, location, {"group": ["patient"]})
    assert leaks, "a row-wise split of 8 rows a patient left every patient on one side"
    assert leaks[0].value.startswith("'p") and "train-" in leaks[0].shards[0]
    assert "holdout-" in leaks[0].shards[1] and "LEAK" in leaks[0].line()


def test_ballast_verify_exits_1_naming_a_leak_a_version_promised_not_to_have(
    grouped, tmp_path, dask_client, capsys
) -> None:
    """Invariant: `ballast verify` passes the grouped chain (exit 0, no LEAK line); on a
    row-wise version whose manifest is edited to claim `group_column`, it exits 1 and
    names a patient on both sides."""
    root, _ = grouped
    assert main(["verify", str(root)]) == 0
    assert "LEAK" not in capsys.readouterr().out
    leaky, _ = run_chain(tmp_path, False, dask_client)
    manifest, location = read_manifest(str(leaky))
    document = json.loads(Path(location).read_text())
    document["config"]["dataset"]["group_column"] = "patient"
    Path(location).write_text(json.dumps(document))
    assert main(["verify", str(leaky)]) == 1
    out = capsys.readouterr().out
    assert f"LEAK version {manifest.version_id}: group 'p" in out and "more" in out


def timed_night(rng: np.random.Generator, night: int, rows: int) -> pa.Table:
    """A night's rows seen during its day (a tenth of them at one instant: ties), then
    a slice of the rows of the night before re-sent late."""
    day = np.datetime64("2024-03-01T00:00:00", "s") + np.timedelta64(night, "D")
    seen = day + rng.integers(0, 86_400, size=rows).astype("timedelta64[s]")
    seen[: rows // 10] = seen[0]
    if night:
        seen[-20:] = seen[-20:] - np.timedelta64(86_400, "s")
    return pa.table(
        {
            "label": (rng.integers(0, 3, size=rows)).tolist(),
            "x": np.round(rng.normal(size=rows), 2),
            "y": rng.integers(0, 4, size=rows).astype(np.float64),
            "seen": pa.array(seen.astype("datetime64[us]")).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def run_time_chains(
    base: Path, dask_client, validation: float = 0.0, nights: int = 3
) -> dict[str, list[ReshardResult]]:
    """A base of two files, then nights each adding one (`nights` in all), held out by
    newest time (beside a `validation` split by time); each night reshards into two
    roots, one by each route."""
    rng = np.random.default_rng(9)
    raw = base / "raw"
    raw.mkdir()
    dataset = DatasetSpec(
        inputs=[str(raw)],
        source_column=None,
        feature_columns=FEATURES,
        holdout_by="newest",
        holdout_column="seen",
        validation_fraction=validation,
    )
    routes = {"staged": 0, "single": None}  # single_pass_bytes: 0 forces the staged route
    results: dict[str, list[ReshardResult]] = {name: [] for name in routes}
    for night in range(nights):
        for part in ("a", "b") if night == 0 else ("c",):
            table = timed_night(rng, night, 300)
            pq.write_table(table, raw / f"{night}-{part}.parquet", row_group_size=100)
        for name, budget in routes.items():
            settings = ReshardConfig(
                dataset=dataset,
                output_root=str(base / name),
                target_shard_rows=200,
                holdout_fraction=0.2,
                mode="incremental",
                seed=11,
                single_pass_bytes=budget,
            )
            results[name].append(run_reshard(settings, dask_client))
    return results


def own_times(result: ReshardResult, split: str, version: str) -> np.ndarray:
    """The times of `split`'s rows that night `version` added, as the chain lists them."""
    parts = [
        pq.read_table(shard_uri(result.manifest_uri, shard), columns=["seen"]).column(0)
        for shard in result.manifest.splits[split].shards
        if (shard.version or result.manifest.version_id) == version
    ]
    return np.concatenate([part.to_numpy().astype("datetime64[us]") for part in parts])


def test_time_holdout_holds_each_nights_newest_rows_on_both_routes(
    tmp_path, dask_client, capsys
) -> None:
    """Invariants: in a chain of three nights under `holdout_by: newest`, each night's
    holdout is that night's newest rows (a fifth, at the cut's resolution) and no train
    row of the night is in a bucket newer than its oldest holdout row's, late re-sent rows
    included; each delta records its cut; the staged route (`single_pass_bytes: 0`) and
    the single pass give the same ids and byte-identical shards; `ballast verify` passes
    the chain, names a night whose recorded cut its rows break, and refuses a cut record
    that is no cut."""
    chains = run_time_chains(tmp_path, dask_client)
    staged, single = chains["staged"], chains["single"]
    assert [r.manifest.route["route"] for r in staged] == ["staged"] * 3
    assert [r.manifest.version_id for r in staged] == [r.manifest.version_id for r in single]
    for ours, theirs in zip(staged, single, strict=True):
        assert digests(ours.manifest) == digests(theirs.manifest)
    last = staged[-1]
    for delta in last.manifest.deltas:
        cut = delta.time_cut
        train, holdout = (own_times(last, s, delta.version_id) for s in ("train", "holdout"))
        assert cut["column"] == "seen" and 0.15 < len(holdout) / (len(train) + len(holdout)) < 0.25
        width = np.timedelta64(int(2 ** cut["level"]), "us")
        assert train.max() < holdout.min() + width, (delta.version_id, cut)
    root = str(tmp_path / "staged")
    assert split_leaks(root) == [] and main(["verify", root]) == 0
    capsys.readouterr()
    manifest, location = read_manifest(version_dir(root, last.manifest.version_id))
    document = json.loads(Path(location).read_text())
    document["deltas"][0]["time_cut"]["cutoff"] //= 2  # a cut far before the night
    Path(location).write_text(json.dumps(document))
    assert main(["verify", root]) == 1
    out = capsys.readouterr().out
    assert f"LEAK version {manifest.deltas[0].version_id}: a train row at 2024-03-01" in out
    document["deltas"][0]["time_cut"]["level"] = "36; rm -rf /"  # an untrusted manifest
    Path(location).write_text(json.dumps(document))
    assert main(["verify", root]) not in (0, None)
    assert "is no cut" in capsys.readouterr().err


def digests(manifest) -> list[str]:
    return [s.sha256 for split in manifest.splits.values() for s in split.shards]


def test_a_time_validation_split_lies_between_train_and_holdout_on_both_routes(
    tmp_path, dask_client, capsys
) -> None:
    """Invariants: beside a time holdout, `validation_fraction` gives each night (a base,
    then an append) a validation split of that night's rows just older than its holdout:
    no train row newer than the oldest validation row's bucket, no validation row newer
    than the oldest holdout row's, each near its fifth; each delta records both cutoffs,
    in that order; training selects on validation; both routes write the same shards;
    `ballast verify` passes the chain and names a validation row across a changed cut."""
    chains = run_time_chains(tmp_path, dask_client, validation=0.2, nights=2)
    staged, single = chains["staged"], chains["single"]
    for ours, theirs in zip(staged, single, strict=True):
        assert digests(ours.manifest) == digests(theirs.manifest)
    last = staged[-1]
    assert last.manifest.selection_split() == "validation"
    for delta in last.manifest.deltas:
        cut = delta.time_cut
        assert cut["validation_cutoff"] < cut["cutoff"]
        assert cut["validation_bucket_start"] <= cut["cutoff_bucket_start"]
        own = {s: own_times(last, s, delta.version_id) for s in ("train", "validation", "holdout")}
        total = sum(len(times) for times in own.values())
        assert all(0.15 < len(own[s]) / total < 0.25 for s in ("validation", "holdout")), cut
        width = np.timedelta64(int(2 ** cut["level"]), "us")
        assert own["train"].max() < own["validation"].min() + width, cut
        assert own["validation"].max() < own["holdout"].min() + width, cut
    root = str(tmp_path / "staged")
    assert split_leaks(root) == [] and main(["verify", root]) == 0
    capsys.readouterr()
    manifest, location = read_manifest(version_dir(root, last.manifest.version_id))
    document = json.loads(Path(location).read_text())
    cut = document["deltas"][0]["time_cut"]
    cut["validation_cutoff"] = cut["cutoff"]  # validation rows now older than their cut
    Path(location).write_text(json.dumps(document))
    assert main(["verify", root]) == 1
    out = capsys.readouterr().out
    assert f"LEAK version {manifest.deltas[0].version_id}: a validation row at" in out
    assert "is older than the night's time cut" in out
