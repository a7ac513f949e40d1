"""Storage primitives of every writer: an atomic write (optionally only if absent, or
streamed from chunks), a whole object (a multipart upload on S3 when it is large), a
host-wide file lock, whether a filesystem is local disk, and a streamed sha256. A write
the storage refuses (no space, quota, permission, read-only) is raised as the
`StorageRefused` it is, naming the path and the bytes it needed, so no retry loop takes
it for a blip.

fsspec and the standard library only; preprocessing/contract/commit.py builds the version
commit on them and preprocessing/contract/manifest.py re-exports them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import fsspec

from preprocessing.storage.limits import DEFAULT_PART_BYTES, MIN_PART_BYTES
from preprocessing.toolbox.faults import storage_refusal


@contextmanager
def refusals_named(path: str, needed_bytes: int | None) -> Iterator[None]:
    """A refusal of the storage inside the block becomes StorageRefused naming `path`."""
    try:
        yield
    except Exception as error:
        refusal = storage_refusal(error, path, needed_bytes)
        if refusal is None or refusal is error:
            raise
        raise refusal from error


@contextmanager
def file_lock(path: str) -> Iterator[None]:
    """An exclusive lock on the local file `path` shared by every process on this host."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return bool({"file", "local"} & set(protocols))


def write_atomically(
    fs: fsspec.AbstractFileSystem, path: str, data: bytes, only_if_absent: bool = False
) -> None:
    """Readers see the old file or the new one, never half (rename locally; one PUT on S3).
    `only_if_absent`: FileExistsError if `path` exists, decided atomically (a hard link
    locally, a conditional PUT on S3), so of two writers exactly one succeeds."""
    with refusals_named(path, len(data)):
        _write_atomically(fs, path, data, only_if_absent)


def _write_atomically(
    fs: fsspec.AbstractFileSystem, path: str, data: bytes, only_if_absent: bool
) -> None:
    if is_local(fs):
        temp = _local_temp(path, [data])
        if not only_if_absent:
            os.replace(temp, path)
            return
        try:
            os.link(temp, path)
        finally:
            os.remove(temp)
    elif only_if_absent and hasattr(fs, "call_s3"):
        bucket, key, _ = fs.split_path(path)
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        fs.invalidate_cache(path)
    else:
        fs.pipe_file(path, data)


def write_stream_atomically(
    fs: fsspec.AbstractFileSystem,
    path: str,
    chunks: Iterable[bytes],
    part_bytes: int = DEFAULT_PART_BYTES,
) -> None:
    """Write the concatenation of `chunks` as one file, holding one chunk (and on S3 one
    part of `part_bytes`) at a time; readers see the old file or the new one, never half
    (rename locally; elsewhere the store's upload, which S3 shows only once complete, and
    abandons on an error)."""
    with refusals_named(path, None):  # the size is not known before the end
        if is_local(fs):
            os.replace(_local_temp(path, chunks), path)
            return
        handle = fs.open(path, "wb", block_size=max(part_bytes, MIN_PART_BYTES))
        try:
            for chunk in chunks:
                handle.write(chunk)
        except BaseException:
            _abandon(handle)
            raise
        handle.close()


def _abandon(handle: Any) -> None:
    """Drop an unfinished upload: s3fs aborts its multipart upload (a single PUT was never
    sent), and the file is marked closed, as its close() would upload what was written."""
    discard = getattr(handle, "discard", None)
    if discard is not None:
        discard()
    with contextlib.suppress(AttributeError):  # a file object whose `closed` is read-only
        handle.closed = True


def _local_temp(path: str, chunks: Iterable[bytes]) -> str:
    """A new temporary file beside `path` holding `chunks`, synced to disk; a write that
    fails (a full disk, an encoder's error) leaves no half file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(temp, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
        raise
    return temp


def write_object(
    fs: fsspec.AbstractFileSystem,
    path: str,
    data: bytes | memoryview,
    part_bytes: int = DEFAULT_PART_BYTES,
) -> str | None:
    """Write a whole object: a local file (directories made), or on S3 one PUT when it is
    under 2 x `part_bytes` and a multipart upload in parts of `part_bytes` (sent
    concurrently) from there; other stores get one `pipe_file`. A reader never sees part
    of it: S3 shows a multipart object only once it is complete. Returns the object's
    ETag on S3 (as a listing shows it, unquoted: what a receipt records so that a rerun
    verifies the object from one listing), None elsewhere."""
    with refusals_named(path, len(data)):
        return _write_object(fs, path, data, part_bytes)


def _write_object(
    fs: fsspec.AbstractFileSystem, path: str, data: bytes | memoryview, part_bytes: int
) -> str | None:
    if is_local(fs):
        try:
            handle = open(path, "wb")  # noqa: SIM115 - closed below
        except FileNotFoundError:  # a new directory: made here once, not checked per object
            os.makedirs(os.path.dirname(path), exist_ok=True)
            handle = open(path, "wb")  # noqa: SIM115 - closed below
        with handle:
            handle.write(data)
        return None
    body = bytes(data)  # s3fs slices the body into parts, which botocore sends as bytes only
    if not hasattr(fs, "call_s3"):
        fs.pipe_file(path, body)
        return None
    # s3fs: `chunksize` is its part size and half its threshold. Its multipart upload
    # returns nothing: one HEAD then, per object of at least twice the part size.
    response = fs.pipe_file(path, body, chunksize=max(part_bytes, MIN_PART_BYTES))
    tag = (response or {}).get("ETag") or fs.info(path).get("ETag")
    return etag(tag)


def etag(value: object) -> str | None:
    """An S3 ETag as a listing or a PUT gives it (quoted), unquoted; None if absent."""
    return str(value).strip('"') if value else None


def file_sha256(uri: str) -> str:
    """Checksum of a whole file, streamed, as recorded per shard in the manifest."""
    digest = hashlib.sha256()
    with fsspec.open(uri, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
