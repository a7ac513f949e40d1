"""Reshard end to end on a real Dask LocalCluster: balance, lineage, determinism, bad inputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import (
    file_sha256,
    read_current_version,
    read_manifest,
    shard_uri,
)
from preprocessing.driver.reshard import TooManyRejected, run_reshard
from preprocessing.exchange.tasks import release_encode_buffers

pytestmark = pytest.mark.slow  # every test here uses the session Dask cluster


def config_for(inputs: Path, output: Path, **overrides) -> ReshardConfig:
    values = {
        "dataset": DatasetSpec(inputs=[str(inputs)]),
        "output_root": str(output),
        "target_shard_rows": 700,
        "rows_per_row_group": 128,
        **overrides,
    }
    return ReshardConfig(**values)


def shard_tables(manifest_uri: str, split: str = "train") -> list[pa.Table]:
    manifest, location = read_manifest(manifest_uri)
    return [pq.read_table(shard_uri(location, s)) for s in manifest.split(split).shards]


def test_version_is_balanced_traceable_and_committed(tiny_raw, tmp_path, dask_client) -> None:
    """Invariants: shards hold N//S or N//S+1 rows and the manifest's numbers; uniform mix
    gives equal classes (+-1); every output id exists in the input; holdout ids are not
    in the training split; `_CURRENT` names the version; checksums match the files; the
    run's write threads let their encode buffers go."""
    # A buffer an earlier test's abandoned task took on this session cluster after its
    # run ended (a failed run's tasks may finish later) is not this run's to release.
    dask_client.run(release_encode_buffers)
    result = run_reshard(config_for(tiny_raw, tmp_path / "out"), dask_client)
    manifest, location = result.manifest, result.manifest_uri
    train = manifest.split("train")
    rows = [shard.num_rows for shard in train.shards]
    assert max(rows) - min(rows) <= 1 and sum(rows) == train.num_rows
    tables = shard_tables(location)
    assert [t.num_rows for t in tables] == rows
    class_rows = pa.concat_tables(tables).column("label").value_counts().to_pylist()
    assert max(c["counts"] for c in class_rows) - min(c["counts"] for c in class_rows) <= 1
    input_ids = set(pq.read_table(tiny_raw, columns=["id"]).column("id").to_pylist())
    train_ids = set(pa.concat_tables(tables).column("id").to_pylist())
    holdout_ids = set(pa.concat_tables(shard_tables(location, "holdout")).column("id").to_pylist())
    assert train_ids <= input_ids and holdout_ids <= input_ids
    assert not train_ids & holdout_ids
    assert read_current_version(str(tmp_path / "out")) == manifest.version_id
    assert all(file_sha256(shard_uri(location, s)) == s.sha256 for s in train.shards)
    assert not (tmp_path / "out" / "_staging" / manifest.version_id).exists()
    # The write tasks' encode buffers, kept per worker thread, were let go with the stage:
    # none is left for another release to count.
    assert set(dask_client.run(release_encode_buffers).values()) == {0}


def test_stratified_shards_each_carry_the_global_mix(tiny_raw, tmp_path, dask_client) -> None:
    """Invariant: in every shard each class has floor or ceil of its total / num shards."""
    result = run_reshard(config_for(tiny_raw, tmp_path / "out"), dask_client)
    train = result.manifest.split("train")
    totals: dict[str, int] = {}
    for shard in train.shards:
        for label, n in shard.class_counts.items():
            totals[label] = totals.get(label, 0) + n
    num_shards = len(train.shards)
    for shard in train.shards:
        for label, total in totals.items():
            rows = shard.class_counts.get(label, 0)
            assert total // num_shards <= rows <= -(-total // num_shards)


def test_rerun_does_no_work_and_output_is_independent_of_workers(
    tiny_raw, tmp_path, dask_client
) -> None:
    """Invariants: the same config finds the committed version (reused); runs on other
    cluster shapes (1 and 4 workers), to other roots, write byte-identical shards under the
    same version id."""
    config = config_for(tiny_raw, tmp_path / "a", shuffle="global")
    first = run_reshard(config, dask_client)
    again = run_reshard(config, dask_client)
    assert again.reused and again.manifest.version_id == first.manifest.version_id
    digests = lambda m: [s.sha256 for s in m.split("train").shards]  # noqa: E731
    for num_workers in (1, 4):
        other = run_reshard(
            config.model_copy(
                update={
                    "output_root": str(tmp_path / f"w{num_workers}"),
                    "num_workers": num_workers,
                }
            )
        )
        assert other.manifest.version_id == first.manifest.version_id
        assert digests(other.manifest) == digests(first.manifest)


def test_bad_files_are_rejected_with_their_reason(tiny_raw, tmp_path, dask_client) -> None:
    """Invariant: a truncated file, an empty file and a drifted schema are each listed in the
    manifest with a reason, and the good files still make the version."""
    inputs = tmp_path / "raw"
    shutil.copytree(tiny_raw, inputs)
    good = sorted(inputs.glob("*.parquet"))
    (inputs / "truncated.parquet").write_bytes(good[0].read_bytes()[:300])
    pq.write_table(pq.read_table(good[1]).slice(0, 0), inputs / "empty.parquet")
    drifted = pq.read_table(good[2])
    drifted = drifted.set_column(1, "label", drifted.column("label").cast(pa.string()))
    pq.write_table(drifted, inputs / "zdrift.parquet")
    config = config_for(inputs, tmp_path / "out", max_rejected_fraction=0.5)
    rejected = run_reshard(config, dask_client).manifest.rejected
    reasons = {Path(r.path).name: r.reason for r in rejected}
    assert set(reasons) == {"truncated.parquet", "empty.parquet", "zdrift.parquet"}
    assert "unreadable" in reasons["truncated.parquet"]
    assert "empty" in reasons["empty.parquet"]
    assert "column 'label' is string, expected int64" in reasons["zdrift.parquet"]


def test_too_many_rejected_files_fail_the_run_naming_them(
    tiny_raw, tmp_path, dask_client: Client
) -> None:
    """Invariant: past max_rejected_fraction (default 0) the run fails and names the file."""
    inputs = tmp_path / "raw"
    shutil.copytree(tiny_raw, inputs)
    (inputs / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(TooManyRejected, match=r"broken\.parquet"):
        run_reshard(config_for(inputs, tmp_path / "out"), dask_client)
    assert read_current_version(str(tmp_path / "out")) is None


@pytest.mark.parametrize("mode", ["block", "none"])
def test_contiguous_modes_commit_exact_balanced_versions(
    mode, tiny_raw, tmp_path, dask_client
) -> None:
    """Invariants: `block` and `none` shards hold N//S or N//S+1 rows, and the uniform mix is
    exact (every class within one row of the others) in those modes too."""
    result = run_reshard(config_for(tiny_raw, tmp_path / mode, shuffle=mode), dask_client)
    tables = shard_tables(result.manifest_uri)
    rows = [t.num_rows for t in tables]
    assert max(rows) - min(rows) <= 1
    counts = pa.concat_tables(tables).column("label").value_counts().to_pylist()
    assert max(c["counts"] for c in counts) - min(c["counts"] for c in counts) <= 1


def test_target_shard_bytes_sizes_shards_from_the_input_row_size(
    tiny_raw, tmp_path, dask_client
) -> None:
    """Invariant: with a byte target, rows per shard = target / input bytes per row, so
    halving the target (about) doubles the number of shards."""
    one = (
        run_reshard(config_for(tiny_raw, tmp_path / "a", target_shard_bytes=40_000), dask_client)
        .manifest.split("train")
        .shards
    )
    two = (
        run_reshard(config_for(tiny_raw, tmp_path / "b", target_shard_bytes=20_000), dask_client)
        .manifest.split("train")
        .shards
    )
    assert len(one) > 1 and abs(len(two) - 2 * len(one)) <= 1
