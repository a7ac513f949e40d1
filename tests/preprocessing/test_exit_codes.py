"""`python -m preprocessing` exits with the codes its help documents, with one line naming
the file, field or bucket (preprocessing/contract/exit_status.py): bad input 2, a lost
`_CURRENT` race 3, storage that may answer later 4, storage that refuses 5, a bug 1. The
traceback goes to a log file, and a cleanup that fails after the cause never replaces it.

The table drives each case the faults round found exiting 1 with a traceback, through
`main` against the session's Dask cluster (slow); the quick tests check the mapping."""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from botocore.exceptions import ClientError
from distributed import Client
from fsspec.implementations.local import LocalFileSystem

from flows.cli.main import failure_status
from flows.cli.main import main as flows_main
from preprocessing.__main__ import main
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.commit import CommitConflict
from preprocessing.contract.exit_status import (
    BAD_INPUT,
    CONFLICT,
    INTERNAL,
    STORAGE_REFUSED,
    TRANSIENT,
    cause_line,
    exit_status,
)
from preprocessing.contract.manifest import ManifestError
from preprocessing.driver.reshard import InputsUnreadable, TooManyRejected
from preprocessing.scan.feature_stats import InputError
from preprocessing.storage.objects import write_object
from preprocessing.toolbox.faults import RetryPolicy, StorageRefused, TruncatedRead
from preprocessing.versions.attempt import VersionAttempt
from tests.test_error_taxonomy import LIBC, mount


def test_each_kind_of_error_maps_to_its_documented_code() -> None:
    """Invariant: every kind the taxonomy knows has one code: conflict 3, refusal 5 (an
    errno or an S3 code, as botocore raises it), transient 4, bad input 2, a bug 1."""
    no_bucket = ClientError(
        {"Error": {"Code": "NoSuchBucket", "Message": "no", "BucketName": "ballast-gone"}},
        "PutObject",
    )
    table = [
        (CommitConflict("x"), CONFLICT),
        (OSError(errno.EROFS, "Read-only file system", "/out/x"), STORAGE_REFUSED),
        (OSError(errno.ENOSPC, "No space left", "/out/x"), STORAGE_REFUSED),
        (no_bucket, STORAGE_REFUSED),
        (InputsUnreadable("x"), TRANSIENT),
        (TruncatedRead("x"), TRANSIENT),
        (ConnectionRefusedError("x"), TRANSIENT),
        (TimeoutError("x"), TRANSIENT),
        (InputError("x"), BAD_INPUT),
        (TooManyRejected("x"), BAD_INPUT),
        (ManifestError("x"), BAD_INPUT),
        (ValueError("x"), BAD_INPUT),
        (FileNotFoundError("config x: no such file"), BAD_INPUT),
        (KeyError("x"), INTERNAL),
        (AttributeError("x"), INTERNAL),
    ]
    assert [(error, exit_status(error)) for error, _ in table] == table
    assert cause_line(no_bucket).startswith("no such bucket for bucket ballast-gone")


def write_raw(directory: Path, num_classes: int = 4, num_rows: int = 400) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    table = pa.table(
        {
            "label": [f"c{i % num_classes}" for i in range(num_rows)],
            "features": rng.random(num_rows),
        }
    )
    pq.write_table(table, directory / "part-0.parquet")
    return directory


def run_main(
    tmp_path: Path,
    client: Client,
    dataset: DatasetSpec,
    output_root: str,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str]:
    """`python -m preprocessing` on one config; (its status, its last stderr line)."""
    config = ReshardConfig(
        dataset=dataset,
        output_root=output_root,
        num_workers=1,
        retry=RetryPolicy(attempts=2, first_delay_s=0.01),
    )
    path = tmp_path / "reshard.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    status = main(["--config", str(path), "--scheduler", client.scheduler.address])
    lines = capsys.readouterr().err.strip().splitlines()
    return status, lines[-1] if lines else ""


MS_RDONLY, MS_REMOUNT = 1, 32
Case = Callable[[Path], tuple[DatasetSpec, str]]


def label_typo(tmp_path: Path) -> tuple[DatasetSpec, str]:
    return DatasetSpec(
        inputs=[str(write_raw(tmp_path / "raw"))], label_column="lable", source_column=None
    ), str(tmp_path / "out")


def too_many_classes(tmp_path: Path) -> tuple[DatasetSpec, str]:
    raw = write_raw(tmp_path / "raw", num_classes=10_050, num_rows=10_050)
    return DatasetSpec(inputs=[str(raw)], source_column=None), str(tmp_path / "out")


def tiny_disk(tmp_path: Path) -> Path:
    """A 1 MiB tmpfs at tmp_path/disk (unmounted by the test's `unmount` fixture)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount(disk)
    return disk


def read_only_output(tmp_path: Path) -> tuple[DatasetSpec, str]:
    disk = tiny_disk(tmp_path)
    mount(disk, flags=MS_RDONLY | MS_REMOUNT)
    raw = write_raw(tmp_path / "raw")
    return DatasetSpec(inputs=[str(raw)], source_column=None), str(disk / "out")


def full_disk(tmp_path: Path) -> tuple[DatasetSpec, str]:
    disk = tiny_disk(tmp_path)
    raw = write_raw(tmp_path / "raw", num_rows=300_000)  # about 2.4 MB of doubles: > 1 MiB
    return DatasetSpec(inputs=[str(raw)], source_column=None), str(disk / "out")


def unreachable_inputs(tmp_path: Path) -> tuple[DatasetSpec, str]:
    return DatasetSpec(inputs=["s3://ballast-nowhere/raw"], source_column=None), str(
        tmp_path / "out"
    )


@pytest.fixture
def unmount(tmp_path: Path) -> Iterator[None]:
    yield
    if (tmp_path / "disk").is_mount():
        LIBC.umount2(str(tmp_path / "disk").encode(), 2)  # MNT_DETACH: workers may hold files


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "status", "named"),
    [
        (label_typo, BAD_INPUT, "lable"),
        (too_many_classes, BAD_INPUT, "max_classes"),
        (read_only_output, STORAGE_REFUSED, "read-only file system at"),
        (full_disk, STORAGE_REFUSED, "no space left on"),
        (unreachable_inputs, TRANSIENT, "ballast-nowhere"),
    ],
)
def test_each_failure_exits_with_its_code_and_one_line(
    case: Case,
    status: int,
    named: str,
    tmp_path: Path,
    dask_client: Client,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    unmount: None,
) -> None:
    """Invariant: each case exits with its documented code; the last line of stderr names
    the cause (the field, the limit, the path or the bucket) and the log holding the
    traceback, and no traceback reaches stderr."""
    monkeypatch.setenv("BALLAST_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    try:
        dataset, output_root = case(tmp_path)
    except OSError as error:
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    found, line = run_main(tmp_path, dask_client, dataset, output_root, capsys)
    assert (found, named in line) == (status, True), line
    assert "Traceback" not in line and "(traceback: " in line
    log = Path(line.rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert log.parent == tmp_path / "logs" and "Traceback" in log.read_text()


def test_a_cleanup_that_fails_after_the_cause_never_replaces_it(
    tmp_path: Path, unmount: None
) -> None:
    """Invariant: the output made read-only mid-run fails the run with the refusal of the
    write (exit 5, naming the file); the staging cleanup, refused too, is logged and does
    not replace it (before: the last line was the cleanup's `Read-only file system:
    'part-0000004.arrow'`)."""
    try:
        disk = tiny_disk(tmp_path)
    except OSError as error:
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    with pytest.raises(StorageRefused) as caught, VersionAttempt(str(disk), "v1") as attempt:
        staged = Path(attempt.shard_uri("part-0000004.arrow"))
        staged.parent.mkdir(parents=True, exist_ok=True)
        staged.write_bytes(b"x")
        mount(disk, flags=MS_RDONLY | MS_REMOUNT)
        target = attempt.shard_uri("part-0000005.arrow")
        write_object(LocalFileSystem(), target, b"y")
    assert exit_status(caught.value) == STORAGE_REFUSED
    assert cause_line(caught.value).startswith("read-only file system at ")
    assert "part-0000005.arrow" in cause_line(caught.value) and staged.exists()


def test_ballast_run_exits_with_the_same_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Invariant: `ballast run` maps a failure through the same table: a config whose
    output root lies inside its input root exits 2 naming both, in one line."""
    config = tmp_path / "reshard.yaml"
    config.write_text(
        f"reshard:\n  dataset: {{inputs: [{tmp_path}/raw]}}\n  output_root: {tmp_path}/raw/out\n"
    )
    assert flows_main(["run", "reshard", "--config", str(config)]) == BAD_INPUT
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"output_root {tmp_path}/raw/out is inside" in error
    assert failure_status(CommitConflict("x")) == CONFLICT
    assert failure_status(OSError(errno.ENOSPC, "full", "/x")) == STORAGE_REFUSED
