"""The version commit: shards in place, the manifest written last, then `_CURRENT` moved by
compare-and-swap.

Writers commit only through `commit_version`, whose every step a rerun finishes
(docs/reliability.md): a manifest found written is not written again, and `_CURRENT` is
advanced to it when empty, unreadable or behind. `swap_current` is the compare-and-swap:
under a file lock locally, a conditional PUT on S3, so of two concurrent commits one wins
and the other gets `CommitConflict`. `KILL_AT_ENV` is the tests' hook to kill a process
after one of `COMMIT_STEPS`.
"""

from __future__ import annotations

import os
import signal
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from fsspec.core import url_to_fs

from preprocessing.contract.manifest import (
    CURRENT_NAME,
    Manifest,
    check_manifest,
    manifest_uri,
    read_current_version,
    read_manifest,
    version_dir,
)
from preprocessing.storage.objects import file_lock, is_local, write_atomically
from preprocessing.toolbox.faults import PermanentError

ANY_PREVIOUS = "*"  # swap_current(expected=ANY_PREVIOUS) replaces whatever `_CURRENT` names
KILL_AT_ENV = "BALLAST_KILL_AT"  # test hook: a process SIGKILLs itself after the step it names
COMMIT_STEPS = ("shards", "manifest", "swap")  # in order; "shards": all in place


class CommitConflict(PermanentError, RuntimeError):
    """Another run moved `_CURRENT` between this run's start and its commit: that run's
    version stands, and a rerun decides afresh what to build on it (never a retry loop)."""


@dataclass(frozen=True)
class Commit:
    """The committed version, its manifest's URI, and whether this call wrote it."""

    manifest: Manifest
    location: str
    written: bool


def commit_version(root: str, manifest: Manifest, expected: str | None = ANY_PREVIOUS) -> Commit:
    """Commit a version whose shards are in its directory: the manifest last, then `_CURRENT`.

    `expected`: what `_CURRENT` named when the run started (`ANY_PREVIOUS`: anything).
    Writing the manifest, this call moves `_CURRENT` from `expected` or raises
    CommitConflict; finding it written (a rerun, a concurrent attempt), it finishes that
    attempt's swap if `_CURRENT` is empty, unreadable or names an older version."""
    check_manifest(manifest, manifest_uri(root, manifest.version_id))
    if not manifest.created_at:
        manifest = replace(manifest, created_at=datetime.now(UTC).isoformat("T", "milliseconds"))
    _reached("shards")
    location, written = _write_manifest(root, manifest)
    _reached("manifest")
    committed = manifest if written else read_manifest(location)[0]
    if written or expected == ANY_PREVIOUS:
        swap_current(root, manifest.version_id, expected)
    else:
        _advance_if_behind(root, committed)
    _reached("swap")
    return Commit(committed, location, written)


def _reached(step: str) -> None:  # the kill hook of KILL_AT_ENV
    if os.environ.get(KILL_AT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def _write_manifest(root: str, manifest: Manifest) -> tuple[str, bool]:
    """Write the manifest unless it exists; its URI and whether this call wrote it."""
    location = manifest_uri(root, manifest.version_id)
    fs, path = url_to_fs(location)
    try:
        if fs.exists(path):  # a rerun: not even a temporary file in the committed directory
            raise FileExistsError(path)
        write_atomically(fs, path, manifest.to_json().encode(), only_if_absent=True)
    except OSError:  # it exists, or S3's 412 Precondition Failed as another OSError
        fs.invalidate_cache(path)
        if not fs.exists(path):
            raise
        return location, False
    return location, True


def _advance_if_behind(root: str, manifest: Manifest) -> None:
    """Finish an earlier attempt's swap: `_CURRENT` moves to `manifest`'s version if it is
    empty, unreadable or names an older one (an unstamped created_at is older than any)."""
    found = read_current_version(root)
    try:
        current = read_manifest(version_dir(root, found))[0] if found else None
        behind = current is None or _created(current) < _created(manifest)
    except (ValueError, TypeError):  # ManifestError, or a created_at that is no time
        behind = True
    if behind and found != manifest.version_id:
        with suppress(CommitConflict):  # a newer version became current meanwhile: it stays
            swap_current(root, manifest.version_id, expected=found)


def _created(manifest: Manifest) -> datetime:
    return datetime.fromisoformat(manifest.created_at or "0001-01-01T00:00:00+00:00")


def swap_current(root: str, version_id: str, expected: str | None = ANY_PREVIOUS) -> None:
    """Point `_CURRENT` at `version_id` if it still names `expected` or `version_id`
    (compare and swap): under a file lock locally; on S3 a PUT conditional on the
    pointer's ETag or absence, so of two concurrent commits exactly one wins; other stores
    have no conditional write: check, then write (a documented limitation)."""
    fs, path = url_to_fs(root.rstrip("/"))
    pointer = f"{path}/{CURRENT_NAME}"
    if hasattr(fs, "call_s3"):
        _swap_s3(fs, root, pointer, version_id, expected)
        return
    with file_lock(f"{pointer}.lock") if is_local(fs) else nullcontext():
        if _check_expected(root, read_current_version(root), expected, version_id):
            write_atomically(fs, pointer, f"{version_id}\n".encode())


def _check_expected(root: str, found: str | None, expected: str | None, version_id: str) -> bool:
    """Whether `_CURRENT` must be written: False when it names `version_id` already."""
    if found == version_id:
        return False
    if expected != ANY_PREVIOUS and found != expected:
        raise CommitConflict(
            f"{root}: _CURRENT moved to {found!r} while this run made "
            f"{version_id!r} (expected {expected!r}); version {version_id} "
            f"is written but not current"
        )
    return True


def _swap_s3(fs: Any, root: str, pointer: str, version_id: str, expected: str | None) -> None:
    fs.invalidate_cache(pointer)
    etag = fs.info(pointer)["ETag"] if fs.exists(pointer) else None
    found = read_current_version(root) if etag else None
    if not _check_expected(root, found, expected, version_id):
        return
    bucket, key, _ = fs.split_path(pointer)
    condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
    try:
        fs.call_s3(
            "put_object", Bucket=bucket, Key=key, Body=f"{version_id}\n".encode(), **condition
        )
    except OSError as error:  # 412 Precondition Failed: another commit won the race
        fs.invalidate_cache(pointer)
        if read_current_version(root) != version_id:
            raise CommitConflict(f"{root}: another commit moved _CURRENT ({error})") from error
    finally:
        fs.invalidate_cache(pointer)
