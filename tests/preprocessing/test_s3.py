"""Resharding from and to S3 (moto's server on loopback), `duplicates: drop` on S3, the
S3 commit race, and the Delta Lake table of an S3 root read back by `deltalake`."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import fsspec
import polars as pl
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.commit import CommitConflict, swap_current
from preprocessing.contract.manifest import (
    Manifest,
    file_sha256,
    read_current_version,
    read_manifest,
    shard_uri,
)
from preprocessing.driver.cluster import DaskConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.storage.limits import MIN_PART_BYTES
from preprocessing.storage.objects import write_stream_atomically
from preprocessing.versions.table import (
    SPLIT_COLUMN,
    _commit,
    committed_version_id,
    publish_current,
    read_head,
)
from tests.preprocessing.table_readers import check_every_reader

pytestmark = pytest.mark.slow  # every test here uses moto's S3 server


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"ballast-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("s3").mkdir(name)
    return name


def test_reshard_s3_to_s3_commits_a_readable_version(tiny_raw, bucket) -> None:
    """Invariants: inputs listed by an s3:// glob; shards balanced (+-1) with checksums that
    match the stored objects; `_CURRENT` on S3 names the version; a rerun is reused."""
    fs = fsspec.filesystem("s3")
    fs.put(f"{tiny_raw}/", f"{bucket}/raw/", recursive=True)
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[f"s3://{bucket}/raw/*.parquet"]),
        output_root=f"s3://{bucket}/datasets",
        target_shard_rows=800,
        num_workers=1,
    )
    result = run_reshard(config)
    manifest, location = read_manifest(f"s3://{bucket}/datasets")
    assert manifest.version_id == result.manifest.version_id
    rows = [shard.num_rows for shard in manifest.split("train").shards]
    assert len(rows) > 1 and max(rows) - min(rows) <= 1
    assert all(
        file_sha256(shard_uri(location, shard)) == shard.sha256
        for shard in manifest.split("train").shards
    )
    assert read_current_version(f"s3://{bucket}/datasets") == manifest.version_id
    assert run_reshard(config).reused


def test_two_concurrent_commits_to_one_s3_root_exactly_one_wins(bucket) -> None:
    """Invariant: racing compare-and-swaps of `_CURRENT` from the same previous state
    leave exactly one winner; every loser gets CommitConflict; `_CURRENT` names the winner."""
    root = f"s3://{bucket}/race"
    outcomes: dict[str, str] = {}
    barrier = threading.Barrier(4)

    def commit(version_id: str) -> None:
        barrier.wait()
        try:
            swap_current(root, version_id, expected=None)
            outcomes[version_id] = "won"
        except CommitConflict:
            outcomes[version_id] = "lost"

    threads = [threading.Thread(target=commit, args=(f"v{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [v for v, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == 4 and len(winners) == 1
    assert read_current_version(root) == winners[0]


def test_an_incremental_child_on_s3_lists_its_parent_and_a_lost_one_is_removed(
    tiny_raw, bucket, tmp_path
) -> None:
    """Invariants on S3 (where shards go straight to their final keys): a child that finds
    `_CURRENT` moved on while it ran raises CommitConflict and removes its manifest and
    every shard object it wrote; from the parent again, the child commits, and its
    parent's entries resolve to the parent's objects with their checksums."""
    import numpy as np
    import pyarrow.parquet as pq

    from preprocessing.synthetic.tabular import SampleSpec, sample_table

    fs = fsspec.filesystem("s3")
    fs.put(f"{tiny_raw}/", f"{bucket}/raw/", recursive=True)
    root = f"s3://{bucket}/datasets"
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[f"s3://{bucket}/raw/*.parquet"]),
        output_root=root,
        target_shard_rows=800,
        num_workers=1,
        mode="incremental",
    )
    base = run_reshard(config).manifest.version_id
    table = sample_table(np.random.default_rng(0), 90_000, 300, 0, SampleSpec(num_features=4))
    pq.write_table(table, tmp_path / "night.parquet")
    fs.put(str(tmp_path / "night.parquet"), f"{bucket}/raw/night.parquet")

    def others() -> list[str]:
        fs.invalidate_cache()
        return [
            path
            for path in fs.find(f"{bucket}/datasets")
            # The base's own: its version, `_CURRENT` and the table that holds the base.
            if f"/v-{base}/" not in path and "_CURRENT" not in path and "/_delta_log/" not in path
        ]

    written: list[str] = []

    def move_current(stage: str, done: int, total: int) -> None:
        if stage == "write" and done == total and read_current_version(root) == base:
            written.extend(others())
            swap_current(root, "elsewhere0", expected=base)

    with pytest.raises(CommitConflict, match="elsewhere0"):
        run_reshard(config, progress=move_current)
    assert any(path.endswith(".parquet") for path in written) and others() == []
    swap_current(root, base, expected="elsewhere0")
    child = run_reshard(config)
    manifest, location = read_manifest(root)
    assert manifest.version_id == child.manifest.version_id and manifest.parent_version == base
    parents = [e for e in manifest.split("train").shards if e.version is not None]
    assert parents and all(f"/v-{base}/" in shard_uri(location, e) for e in parents)
    assert all(
        file_sha256(shard_uri(location, e)) == e.sha256
        for split in manifest.splits.values()
        for e in split.shards
    )
    check_s3_table(root, manifest, location, [base, manifest.version_id])


def check_s3_table(root: str, manifest: Manifest, location: str, history: list[str]) -> None:
    """The Delta table at an S3 root, read by `deltalake` as a user would (the
    AWS_* environment and plain HTTP allowed): exactly the manifest's shards and rows per
    split, the parent's shards in place, one table version per ballast version."""
    options = {"AWS_ALLOW_HTTP": "true"}
    table = DeltaTable(root, storage_options=options)
    expected = {name: split.num_rows for name, split in manifest.splits.items()}
    rows = pl.from_arrow(table.to_pyarrow_table()).group_by(SPLIT_COLUMN).len().rows()
    assert dict(rows) == expected
    uris = [shard_uri(location, e) for split in manifest.splits.values() for e in split.shards]
    assert sorted(table.file_uris()) == sorted(uris)
    assert [committed_version_id(root, v) for v in range(table.version() + 1)] == history
    check_every_reader(root)  # Polars' own reader, through pyarrow, and Daft on S3 too


def test_a_stale_publisher_on_s3_fails_its_table_commit_and_converges(bucket) -> None:
    """Invariants on S3 (no locking provider: the log entry's put-if-absent): a publisher
    that read the table head before another published fails its commit; the next look
    finds the table in step with `_CURRENT`, one table version per ballast version."""
    from tests.preprocessing.test_table import write_version

    root = f"s3://{bucket}/race"
    for version_id in ("a", "b"):
        write_version(root, version_id)
    stale = read_head(root)
    assert stale is not None and stale.version_id == "b"
    write_version(root, "c")  # `_CURRENT` moves and the table follows, past `stale`
    with pytest.raises(CommitFailedError):
        _commit(root, read_manifest(f"{root}/v-a")[0], stale)
    assert publish_current(root) == 2
    assert [committed_version_id(root, v) for v in range(3)] == ["a", "b", "c"]


@pytest.mark.parametrize("chunk_mb", [1, 3])
def test_a_streamed_write_to_s3_is_whole_or_absent(bucket: str, chunk_mb: int) -> None:
    """Invariants (the scan record's write, preprocessing/storage/objects.py): chunks
    streamed to S3 read back as their concatenation, in one PUT (2 MB) or a multipart
    upload of 5 MB parts (6 MB); a stream that fails part way leaves no object and no
    multipart upload open, whether or not a part had been sent."""
    fs = fsspec.filesystem("s3")
    chunk = bytes(range(256)) * (4 * 1024 * chunk_mb)
    whole = f"{bucket}/whole-{chunk_mb}"
    write_stream_atomically(fs, whole, iter([chunk] * 2 + [b"end"]), part_bytes=MIN_PART_BYTES)
    assert fs.cat_file(whole) == chunk * 2 + b"end"

    def uploads() -> list[dict]:
        return fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])

    open_at_failure = []

    def failing() -> Iterator[bytes]:
        yield from [chunk] * 2
        open_at_failure.extend(uploads())
        raise OSError("the encoder failed")

    broken = f"{bucket}/broken-{chunk_mb}"
    with pytest.raises(OSError, match="the encoder failed"):
        write_stream_atomically(fs, broken, failing(), part_bytes=MIN_PART_BYTES)
    fs.invalidate_cache()
    assert not fs.exists(broken) and uploads() == []
    assert len(open_at_failure) == (1 if chunk_mb == 3 else 0)  # a part sent only at 6 MB


@pytest.mark.parametrize("budget", [0, None], ids=["staged", "single-pass"])
def test_drop_on_s3_keeps_the_first_copies_and_the_bytes_of_a_local_run(
    bucket, tmp_path, budget
) -> None:
    """Invariants of `duplicates: drop` with inputs and output on S3 (its pairs and drop
    lists then live under the attempt's S3 prefix): exactly the first copy of each content
    by (file, row) is written, the delta counts the rest as dropped, and the shards are
    row for row those of the same files resharded on local disk (derived ids name the
    file, not its root; only `source`, the input as listed, differs), on either route."""
    from preprocessing.plan.row_ids import DERIVED_ID_COLUMN
    from tests.preprocessing.test_duplicates_drop import (
        content_key,
        first_copies,
        reshard_config,
        write_files,
        written,
    )

    base = [(i % 3, float(i), i % 2, f"r{i}") for i in range(40)]
    files = [base, [*base[5:25], (1, -0.0, 0, "new")], base[::3]]
    raw = tmp_path / "raw"
    write_files(raw, files)
    fsspec.filesystem("s3").put(f"{raw}/", f"{bucket}/raw/", recursive=True)
    threads = DaskConfig(kind="threads", num_workers=1)  # no worker processes to start
    local = run_reshard(reshard_config(raw, tmp_path / "out", "drop", budget), threads)
    config = reshard_config(raw, tmp_path / "unused", "drop", budget)
    s3_inputs = config.dataset.model_copy(update={"inputs": [f"s3://{bucket}/raw/*.parquet"]})
    remote_config = config.model_copy(
        update={"dataset": s3_inputs, "output_root": f"s3://{bucket}/datasets"}
    )
    remote = run_reshard(remote_config, threads)
    assert remote.manifest.route["route"] == ("staged" if budget == 0 else "single_pass")
    here, there = written(local), written(remote)
    assert there.keys() == here.keys()
    for split, table in there.items():  # all but `source`, which names the input as listed
        assert table.drop_columns("source").equals(here[split].drop_columns("source"))
    kept = written(remote)
    ids = {i for table in kept.values() for i in table.column(DERIVED_ID_COLUMN).to_pylist()}
    assert ids == first_copies(files)
    distinct = {content_key(row) for rows in files for row in rows if row[2] is not None}
    rows_in = sum(1 for rows in files for row in rows if row[2] is not None)
    dropped = remote.manifest.deltas[-1].split_values
    assert sum(v["dropped_duplicates"] for v in dropped.values()) == rows_in - len(distinct)
