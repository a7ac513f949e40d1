"""A reshard killed mid-write resumes from the scans its dead attempt kept
(preprocessing/scan/scan_record.py): with every input's bytes zeroed after the kill (size
and modification time kept, so the listing and the version id are unchanged, and any read
of them would fail) the rerun still commits a clean run's shards, so it read no input;
with the record damaged it scans again and commits the same shards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from distributed import Client

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import ReshardResult, run_reshard
from preprocessing.scan.scan_record import SCANS_NAME
from preprocessing.synthetic.tabular import SampleSpec, write_sample
from preprocessing.versions.attempt import STAGING_DIR
from tests.log_records import messages, records_of
from tests.preprocessing.test_kill import (
    assert_committed,
    kill_session,
    start_reshard,
    wait_for_staged,
)

pytestmark = pytest.mark.slow  # reshards, one in its own process with its own cluster

NUM_FILES = 8


def digests(result: ReshardResult) -> list[str]:
    return [s.sha256 for split in ("train", "holdout") for s in result.manifest.split(split).shards]


@pytest.fixture(scope="module")
def raw_and_clean(
    tmp_path_factory: pytest.TempPathFactory, dask_client: Client
) -> tuple[Path, list[str]]:
    """The raw files, and the shard digests of a clean run of `config_of` on them."""
    directory = tmp_path_factory.mktemp("kill_scans")
    write_sample(directory / "raw", SampleSpec(num_rows=120_000, num_files=NUM_FILES, seed=13))
    clean = run_reshard(config_of(directory / "raw", directory / "clean"), dask_client)
    return directory / "raw", digests(clean)


def config_of(raw: Path, root: Path) -> ReshardConfig:
    return ReshardConfig(
        dataset=DatasetSpec(inputs=[str(raw)]),
        output_root=str(root),
        target_shard_rows=1_000,
        rows_per_row_group=500,
        exchange_task_bytes=1 << 20,
        single_pass_bytes=0,  # the staged route's resume
        exchange_fan_in=4,
    )


def killed_mid_write(config: ReshardConfig, tmp_path: Path) -> Path:
    """Run `config` in its own process, SIGKILL it once a write task's receipt is staged;
    the scan record its dead attempt left."""
    process = start_reshard(config, tmp_path)
    wait_for_staged(Path(config.output_root), process, "receipts/write-*.json")
    kill_session(process)
    (record,) = Path(config.output_root).glob(f"{STAGING_DIR}/*/*/{SCANS_NAME}")
    return record


@contextmanager
def zeroed(files: list[Path]) -> Iterator[None]:
    """Every byte of `files` zero inside the block (sizes and modification times kept: the
    same listing), restored after it."""
    kept = {path: (path.read_bytes(), path.stat()) for path in files}
    try:
        for path, (data, stat) in kept.items():
            path.write_bytes(bytes(len(data)))
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        yield
    finally:
        for path, (data, stat) in kept.items():
            path.write_bytes(data)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_rerun_reads_no_input_its_dead_attempt_scanned(
    raw_and_clean, tmp_path, dask_client
) -> None:
    """Invariants: after SIGKILL mid-write and every input zeroed, the rerun keeps the dead
    attempt's scans (its log: "scan kept: the scans of 8 input files") and every map
    output, and commits shards byte-identical to a clean run's, with no staging left."""
    raw, clean = raw_and_clean
    config = config_of(raw, tmp_path / "out")
    killed_mid_write(config, tmp_path)
    with zeroed(sorted(raw.glob("*.parquet"))), records_of("preprocessing") as logged:
        rerun = run_reshard(config, dask_client)
    print(rerun.resumed)
    assert f"scan kept: the scans of {NUM_FILES} input files" in messages(logged).splitlines()
    resumed = rerun.manifest.resumed
    assert resumed["map_outputs_kept"] == resumed["map_outputs"] > 0, resumed
    assert digests(rerun) == clean
    assert_committed(tmp_path / "out", rerun.manifest.version_id)


def test_a_damaged_scan_record_is_scanned_again_to_the_same_shards(
    raw_and_clean, tmp_path, dask_client
) -> None:
    """Invariants: after SIGKILL mid-write and a byte of the kept scan record changed, the
    rerun warns that the record is not used and why, scans again (no "scan kept" line),
    and commits shards byte-identical to a clean run's."""
    raw, clean = raw_and_clean
    config = config_of(raw, tmp_path / "out")
    record = killed_mid_write(config, tmp_path)
    data = bytearray(record.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside a scan's line
    record.write_bytes(bytes(data))
    with records_of("preprocessing") as logged:
        rerun = run_reshard(config, dask_client)
    said = messages(logged)
    assert f"{SCANS_NAME} not used: its payload does not hash to its sha256" in said, said
    assert "scan kept" not in said
    assert digests(rerun) == clean
    assert_committed(tmp_path / "out", rerun.manifest.version_id)
