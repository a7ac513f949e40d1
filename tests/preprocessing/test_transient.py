"""Transient faults cost retries, never data: a reshard from and to moto's S3 server through
a loopback proxy (tests/fault_proxy.py) that answers chosen GETs with 503 SlowDown, 500,
connection resets or bodies cut short, k times per key.

botocore's own retries are off (`AWS_MAX_ATTEMPTS=1`) so that the faults reach ballast's
policy (preprocessing/toolbox/faults.py) after s3fs's five tries per call; each k below is chosen
to outlast those. Each run starts its own Dask workers, which inherit the environment
(those tests are `slow`). The classification itself is checked on local files first.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_current_version, read_manifest
from preprocessing.driver.reshard import InputsUnreadable, ReshardResult, run_reshard
from preprocessing.storage.sources import WHOLE_READ_BYTES, open_input, read_footer
from preprocessing.toolbox.faults import (
    CorruptInput,
    RetryPolicy,
    TruncatedRead,
    call_with_retries,
    is_permanent,
)

FAST_RETRIES = RetryPolicy(attempts=4, first_delay_s=0.1, max_delay_s=0.4)


@pytest.fixture
def raw_bucket(tiny_raw: Path, s3_endpoint: str) -> str:
    """A fresh bucket holding the six raw files under raw/ (uploaded around the proxy)."""
    name = f"transient-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("s3")
    fs.mkdir(name)
    fs.put(f"{tiny_raw}/", f"{name}/raw/", recursive=True)
    return name


def config_for(bucket: str, output: str, **settings: object) -> ReshardConfig:
    return ReshardConfig(
        dataset=DatasetSpec(inputs=[f"s3://{bucket}/raw/*.parquet"]),
        output_root=f"s3://{bucket}/{output}",
        target_shard_rows=700,
        num_workers=2,
        retry=FAST_RETRIES,
        **settings,
    )


def digests(result: ReshardResult) -> dict[str, list[str]]:
    return {
        name: [shard.sha256 for shard in split.shards]
        for name, split in result.manifest.splits.items()
    }


def test_a_corrupt_file_is_permanent_and_read_once(tiny_raw, tmp_path) -> None:
    """Invariant: a file whose bytes were read in full and do not decode is CorruptInput
    (permanent) on the first try: the policy does not read it again."""
    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1" + b"\x07" * 200 + b"PAR1")
    tries: list[int] = []

    def footer() -> object:
        tries.append(1)
        return read_footer(str(corrupt), 1_000)

    with pytest.raises(CorruptInput, match=r"corrupt\.parquet") as raised:
        call_with_retries(footer, policy=FAST_RETRIES)
    assert is_permanent(raised.value) and len(tries) == 1


def test_a_file_cut_short_under_the_reader_is_transient(tmp_path) -> None:
    """Fault: a file too large to be read whole at open is truncated on disk after it was
    opened. Invariant: the read that comes back short raises TruncatedRead (transient),
    never a decode error."""
    path = tmp_path / "shrinking.parquet"
    values = np.random.default_rng(0).integers(0, 1 << 62, 400_000)
    pq.write_table(pa.table({"id": values}), path, row_group_size=100_000)
    assert path.stat().st_size > WHOLE_READ_BYTES
    with open_input(str(path)) as source:
        os.truncate(path, source.num_bytes // 3)
        with pytest.raises(TruncatedRead, match="cut short") as raised:
            pq.ParquetFile(source.reader).read()
    assert not is_permanent(raised.value)


def test_transient_errors_are_retried_until_the_last_try() -> None:
    """Invariants: an error that may pass is retried and the call's value returned once it
    passes; after `attempts` tries the last error is raised as it came, noting the tries;
    an unknown kind of error counts as transient."""
    outcomes: list[BaseException | str] = [ConnectionResetError("reset"), TimeoutError(), "rows"]

    def flaky() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    assert call_with_retries(flaky, policy=FAST_RETRIES) == "rows" and not outcomes
    tries: list[int] = []

    def broken() -> None:
        tries.append(1)
        raise KeyError("an error of no known kind")

    with pytest.raises(KeyError) as raised:
        call_with_retries(broken, policy=FAST_RETRIES)
    assert len(tries) == FAST_RETRIES.attempts
    assert "try 4 of 4" in " ".join(raised.value.__notes__)


@pytest.mark.slow
def test_faults_in_scan_map_and_write_reads_change_no_shard(raw_bucket, proxy) -> None:
    """Fault: each raw file fails its first GETs of the scan (503 x7, 500 x2, reset x6,
    body cut short x6), every raw file fails 2 GETs more once the scan is done (the map
    reads) and every staged object fails 6 once the exchange is done (the write reads).
    Invariant: the run commits, rejects nothing, and every shard's sha256 equals a clean
    run's under the same version id."""
    staged = {"single_pass_bytes": 0}  # the staged route: its staged objects' reads fail too
    clean = run_reshard(config_for(raw_bucket, "clean", **staged))
    for index, fault, times in [(0, "503", 7), (1, "500", 2), (2, "reset", 6), (3, "truncate", 6)]:
        proxy.inject(f"{raw_bucket}/raw/raw-{index:03d}.parquet", fault, times)

    def arm(stage: str, done: int, total: int) -> None:
        if stage == "scan" and done == total:
            proxy.inject(f"{raw_bucket}/raw/*", "500", 2)
        if stage == "exchange" and done == total:
            proxy.inject(f"{raw_bucket}/faulty/_staging/*/round-*/part-*", "truncate", 6)

    faulty = run_reshard(config_for(raw_bucket, "faulty", **staged), progress=arm)
    assert faulty.manifest.version_id == clean.manifest.version_id and not faulty.reused
    assert faulty.manifest.rejected == [] and digests(faulty) == digests(clean)
    kinds = {fault for (_, fault) in proxy.served}
    assert kinds == {"503", "500", "reset", "truncate"}
    assert any("/_staging/" in key for (key, _) in proxy.served)  # the write reads failed
    assert sum(proxy.served.values()) >= 7 + 2 + 6 + 6 + 6 * 2


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["503", "truncate"])
def test_a_file_unreadable_on_every_try_commits_nothing(raw_bucket, proxy, fault) -> None:
    """Fault: one raw file fails every GET, the run allowing half the files rejected.
    Invariants: the run fails naming the file, commits no version and rejects nothing;
    once the store answers, the rerun commits the version with the file's rows in it."""
    config = config_for(raw_bucket, "out", max_rejected_fraction=0.5)
    flaky = f"{raw_bucket}/raw/raw-001.parquet"
    proxy.inject(flaky, fault, 10_000)
    with pytest.raises(InputsUnreadable, match=r"raw-001\.parquet"):
        run_reshard(config)
    root = f"s3://{raw_bucket}/out"
    assert read_current_version(root) is None
    assert not fsspec.filesystem("s3").glob(f"{raw_bucket}/out/v-*/_MANIFEST*")
    proxy.clear()
    result = run_reshard(config)
    assert not result.reused and result.manifest.rejected == []
    assert sum(result.manifest.input_class_counts.values()) == sum(
        pq.ParquetFile(fsspec.open(f"s3://{path}").open()).metadata.num_rows
        for path in fsspec.filesystem("s3").glob(f"{raw_bucket}/raw/*.parquet")
    )
    assert read_current_version(root) == result.manifest.version_id


@pytest.mark.slow
def test_a_corrupt_file_is_rejected_and_only_it(raw_bucket, proxy) -> None:
    """Fault: one object's data pages are garbage before a valid Parquet footer, another file
    fails its first 7 GETs with 503. Invariant: the corrupt one alone is rejected, for a
    decode error; the flaky one is in the version."""
    fs = fsspec.filesystem("s3")
    good = fs.cat(f"{raw_bucket}/raw/raw-002.parquet")
    footer_start = len(good) - 8 - int.from_bytes(good[-8:-4], "little")
    fs.pipe(
        f"{raw_bucket}/raw/raw-002.parquet",
        good[:4] + b"\x07" * (footer_start - 4) + good[footer_start:],
    )
    proxy.inject(f"{raw_bucket}/raw/raw-004.parquet", "503", 7)
    result = run_reshard(config_for(raw_bucket, "out", max_rejected_fraction=0.5))
    rejected = {Path(item.path).name: item.reason for item in result.manifest.rejected}
    assert list(rejected) == ["raw-002.parquet"]
    assert rejected["raw-002.parquet"].startswith("unreadable parquet")
    assert proxy.served[(f"{raw_bucket}/raw/raw-004.parquet", "503")] == 7
    manifest, _ = read_manifest(f"s3://{raw_bucket}/out")
    assert manifest.version_id == result.manifest.version_id
