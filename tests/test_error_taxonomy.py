"""One error taxonomy (preprocessing/toolbox/faults.py) for every layer and every retry:
each layer's errors are classed by what fixes them, and storage that refuses (a full
disk, a read-only file system, a denied permission, an exhausted quota) fails on the
first try with a message naming the path, never after a round of retries."""

from __future__ import annotations

import ctypes
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from botocore.exceptions import ClientError
from s3fs.errors import translate_boto_error

from preprocessing.contract.commit import CommitConflict
from preprocessing.contract.manifest import ManifestError
from preprocessing.driver.reshard import InputsUnreadable, TooManyRejected
from preprocessing.driver.shared_storage import StorageNotShared
from preprocessing.storage.objects import write_atomically, write_object
from preprocessing.toolbox.faults import (
    RetryPolicy,
    StorageRefused,
    TruncatedRead,
    call_with_retries,
    classify,
)
from preprocessing.versions.attempt import StagingError
from tracking.lifecycle.scoring import ModelError
from tracking.lifecycle.trust import UntrustedModel
from tracking.server import TrackingUnavailable
from tracking.server import is_transient as tracking_may_send_later
from training.data.cache import ShardChecksumError
from training.launch.failures import TrainingFailed, is_config_error

POLICY = RetryPolicy(attempts=5, first_delay_s=0.01, max_delay_s=0.02)
LOCAL = fsspec.filesystem("file")


def test_every_layers_errors_are_classed_by_what_fixes_them() -> None:
    """Invariant: the errors the issue found retried as if they could pass are permanent
    or config (no retry loop tries them again), while a body cut short, a reset
    connection and a tracking server that did not answer stay transient."""
    permanent = [
        TooManyRejected("x"),
        InputsUnreadable("x"),
        StagingError("x"),
        CommitConflict("x"),
        ShardChecksumError("x"),
        ModelError("x"),
        UntrustedModel("x"),
        ManifestError("x"),
        TrainingFailed("exited with status 1", 1, ""),
    ]
    assert [classify(error) for error in permanent] == ["permanent"] * len(permanent)
    assert classify(StorageNotShared("x")) == "config" and classify(ValueError("x")) == "config"
    transient = [
        TruncatedRead("cut"),
        ConnectionResetError("reset"),
        TrackingUnavailable("x"),
        TimeoutError(),
        FileNotFoundError(errno.ENOENT, "gone", "s3://b/k"),
    ]
    assert [classify(error) for error in transient] == ["transient"] * len(transient)
    # StorageNotShared and TrackingUnavailable keep their old base for the callers that catch it.
    assert isinstance(StorageNotShared("x"), RuntimeError)
    assert isinstance(TrackingUnavailable("x"), RuntimeError)


def test_permission_quota_and_s3_refusals_are_permanent_everywhere() -> None:
    """Invariant: EACCES, EPERM and EDQUOT, and S3's AccessDenied and QuotaExceeded (as
    botocore raises them and as s3fs translates them into OSErrors), are
    permanent for the reads' retries, for a rank (reported, not retried by the launcher)
    and for the tracking spool (not kept to send later), each naming its path."""
    refusals = [
        PermissionError(errno.EACCES, "Permission denied", "/data/raw/a.parquet"),
        OSError(errno.EPERM, "Operation not permitted", "/data/raw/a.parquet"),
        OSError(errno.EDQUOT, "Disk quota exceeded", "/data/raw/a.parquet"),
    ]
    for code in ("AccessDenied", "QuotaExceeded"):
        s3_error = ClientError(
            {"Error": {"Code": code, "Message": "no"}, "ResponseMetadata": {"HTTPStatusCode": 403}},
            "PutObject",
        )
        refusals += [s3_error, translate_boto_error(s3_error)]  # as boto and s3fs raise it
    for error in refusals:
        assert classify(error) == "permanent" and is_config_error(error)
        assert not tracking_may_send_later(error)
    tries: list[int] = []

    def denied() -> None:
        tries.append(1)
        raise refusals[0]

    with pytest.raises(StorageRefused, match=r"^permission denied on /data/raw/a\.parquet"):
        call_with_retries(denied, policy=POLICY)
    assert tries == [1]


LIBC = ctypes.CDLL(None, use_errno=True)  # mount(2) itself: no subprocess in the quick tier
MS_RDONLY, MS_REMOUNT = 1, 32


def mount(target: Path, flags: int = 0) -> None:
    """mount(2) a 1 MiB tmpfs at `target` (or change its flags); OSError when refused."""
    if LIBC.mount(b"tmpfs", str(target).encode(), b"tmpfs", flags, b"size=1m") != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (skipped where mounting is not permitted: no root, a sandbox)."""
    mount_point = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount_point.mkdir()
    try:
        mount(mount_point)
    except OSError as error:
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    try:
        yield mount_point
    finally:
        LIBC.umount2(str(mount_point).encode(), 0)


def test_a_full_disk_fails_on_the_first_try_naming_path_and_bytes(tiny_disk: Path) -> None:
    """Fault: a shard-sized write (2 MiB) to a 1 MiB file system. Invariants: it fails on
    the first try (not after 5) with StorageRefused "no space left on <path>: N bytes
    needed, M free"; an atomic write leaves no half-written temporary file behind."""
    payload = os.urandom(2 << 20)
    target = str(tiny_disk / "v-1" / "part-00000.parquet")
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        write_object(LOCAL, target, memoryview(payload))

    with pytest.raises(StorageRefused) as raised:
        call_with_retries(write, policy=POLICY)
    assert tries == [1] and raised.value.errno == errno.ENOSPC
    assert str(raised.value).startswith(f"no space left on {target}: {len(payload)} bytes needed, ")
    assert "free" in str(raised.value) and "try 1 of 5" in "".join(raised.value.__notes__)
    os.remove(target)  # the partial file of the plain write
    with pytest.raises(StorageRefused, match="no space left on"):
        write_atomically(LOCAL, str(tiny_disk / "_CURRENT"), payload)
    assert not [name for name in os.listdir(tiny_disk) if ".tmp-" in name]


def test_a_read_only_file_system_fails_on_the_first_try(tiny_disk: Path) -> None:
    """Fault: the output file system is remounted read-only. Invariant: a write fails on
    the first try with "read-only file system at <path>"."""
    mount(tiny_disk, MS_REMOUNT | MS_RDONLY)
    target = str(tiny_disk / "manifest.json")
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        write_atomically(LOCAL, target, b"{}")

    with pytest.raises(StorageRefused, match=f"^read-only file system at {target}"):
        call_with_retries(write, policy=POLICY)
    assert tries == [1]
