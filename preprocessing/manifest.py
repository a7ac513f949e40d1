"""The dataset version contract: names, the manifest, and the `_CURRENT` pointer.

This is the one module of `preprocessing/` that `training/` and `tracking/` may
import (docs/architecture.md), so it depends on the standard library,
pyarrow and fsspec only. A version lives under an output root:

    <root>/v-<version_id>/shard-00000.parquet ...     training split
    <root>/v-<version_id>/holdout-00000.parquet ...   held-out split (not resampled)
    <root>/v-<version_id>/_MANIFEST.json              written last = the commit
    <root>/_CURRENT                                   newest committed version id
    <root>/_staging/<version_id>/                     scratch, never read by consumers

Readers open a version only through `read_manifest`, never by listing files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
from fsspec.core import url_to_fs

FORMAT_VERSION = 1
MANIFEST_NAME = "_MANIFEST.json"
CURRENT_NAME = "_CURRENT"
STAGING_DIR = "_staging"
SPLIT_PREFIX = {"train": "shard", "holdout": "holdout", "predictions": "part"}
ANY_PREVIOUS = "*"  # swap_current(expected=ANY_PREVIOUS) replaces whatever `_CURRENT` names


class ManifestError(ValueError):
    """A manifest that is missing, unreadable, of an unknown format, or inconsistent."""


@dataclass(frozen=True)
class ShardEntry:
    """One committed shard file; `path` is relative to the version directory.

    Every row group holds `rows_per_row_group` rows but the last, so readers plan their
    reads from the manifest alone, without opening footers (see `row_group_sizes`).
    """

    path: str
    num_rows: int
    num_bytes: int
    num_row_groups: int
    rows_per_row_group: int
    sha256: str
    class_counts: dict[str, int]
    source_counts: dict[str, int]

    def row_group_sizes(self) -> list[int]:
        full, last = divmod(self.num_rows, self.rows_per_row_group)
        return [self.rows_per_row_group] * full + ([last] if last else [])


@dataclass(frozen=True)
class SplitEntry:
    """The shards of one split (`train` or `holdout`) in shard-index order."""

    num_rows: int
    shards: list[ShardEntry]


@dataclass(frozen=True)
class RejectedFile:
    """An input file left out of the version, with the reason a person can act on."""

    path: str
    reason: str


@dataclass(frozen=True)
class Manifest:
    """Everything a consumer needs to read a version, and everything needed to audit it."""

    version_id: str
    label_column: str
    source_column: str
    id_column: str
    feature_columns: list[str]
    classes: list[Any]
    sources: list[Any]
    arrow_schema: list[dict[str, str]]
    splits: dict[str, SplitEntry]
    seed: int
    config: dict[str, Any]
    input_fingerprint: str
    input_class_counts: dict[str, int]
    input_source_counts: dict[str, int]
    rejected: list[RejectedFile] = field(default_factory=list)
    # The feature codec's state and the record of nulls (preprocessing/features.py):
    # {"columns": [one ColumnSpec as a dict per feature column], "dropped_rows": {file: n}}.
    features: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    code_version: str = ""
    created_at: str = ""
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str, origin: str) -> Manifest:
        raw = json.loads(text)
        found = raw.get("format_version")
        if found != FORMAT_VERSION:
            raise ManifestError(
                f"{origin}: manifest format_version {found!r} is not supported "
                f"(this ballast reads format_version {FORMAT_VERSION})"
            )
        raw["splits"] = {
            name: SplitEntry(split["num_rows"], [ShardEntry(**s) for s in split["shards"]])
            for name, split in raw["splits"].items()
        }
        raw["rejected"] = [RejectedFile(**r) for r in raw.get("rejected", [])]
        return cls(**raw)

    def split(self, name: str) -> SplitEntry:
        if name not in self.splits:
            raise ManifestError(
                f"version {self.version_id} has no split {name!r}: {list(self.splits)}"
            )
        return self.splits[name]


def shard_name(split: str, index: int) -> str:
    """The zero-padded file name of shard `index` of `split`: one place for the format."""
    return f"{SPLIT_PREFIX[split]}-{index:05d}.parquet"


def version_dir(root: str, version_id: str) -> str:
    return f"{root.rstrip('/')}/v-{version_id}"


def staging_dir(root: str, version_id: str) -> str:
    return f"{root.rstrip('/')}/{STAGING_DIR}/{version_id}"


def manifest_uri(root: str, version_id: str) -> str:
    return f"{version_dir(root, version_id)}/{MANIFEST_NAME}"


def shard_uri(manifest_location: str, entry: ShardEntry) -> str:
    """Absolute URI of a shard, given the URI of the manifest that lists it."""
    return f"{manifest_location.rsplit('/', 1)[0]}/{entry.path}"


def resolve_manifest_uri(uri: str) -> str:
    """Accept a manifest file, a version directory or an output root (read via `_CURRENT`)."""
    uri = uri.rstrip("/")
    if uri.endswith(MANIFEST_NAME):
        return uri
    fs, path = url_to_fs(uri)
    if fs.exists(f"{path}/{MANIFEST_NAME}"):
        return f"{uri}/{MANIFEST_NAME}"
    if fs.exists(f"{path}/{CURRENT_NAME}"):
        version_id = fs.cat_file(f"{path}/{CURRENT_NAME}").decode().strip()
        return manifest_uri(uri, version_id)
    raise ManifestError(
        f"{uri}: no {MANIFEST_NAME} and no {CURRENT_NAME}; is this a ballast dataset?"
    )


def read_manifest(uri: str) -> tuple[Manifest, str]:
    """Read and validate a manifest; returns it with the exact URI it was read from."""
    location = resolve_manifest_uri(uri)
    try:
        with fsspec.open(location, "rt") as handle:
            text = handle.read()
    except FileNotFoundError as error:
        raise ManifestError(f"{location}: manifest not found") from error
    try:
        return Manifest.from_json(text, origin=location), location
    except (KeyError, TypeError, json.JSONDecodeError) as error:
        raise ManifestError(f"{location}: malformed manifest ({error})") from error


def read_current_version(root: str) -> str | None:
    """The committed version id `_CURRENT` points to, or None for an empty root."""
    fs, path = url_to_fs(root.rstrip("/"))
    pointer = f"{path}/{CURRENT_NAME}"
    return fs.cat_file(pointer).decode().strip() if fs.exists(pointer) else None


def write_manifest(root: str, manifest: Manifest) -> str:
    """Write the manifest (the commit point of a version) and return its URI.

    On S3 the PUT is conditional on the key not existing: a concurrent writer of the same
    version id wrote identical content, so losing that race is success.
    """
    location = manifest_uri(root, manifest.version_id)
    fs, path = url_to_fs(location)
    with suppress(FileExistsError):
        _atomic_write(fs, path, manifest.to_json().encode(), only_if_absent=True)
    return location


class CommitConflict(RuntimeError):
    """Another run moved `_CURRENT` between this run's start and its commit."""


def swap_current(root: str, version_id: str, expected: str | None = ANY_PREVIOUS) -> None:
    """Point `_CURRENT` at `version_id` if it still names `expected` (compare and swap).

    Local disk: under an exclusive lock, then a rename. S3: a PUT conditional on the
    pointer's ETag (or on its absence), so of two concurrent commits exactly one wins.
    """
    fs, path = url_to_fs(root.rstrip("/"))
    pointer = f"{path}/{CURRENT_NAME}"
    if _is_local(fs):
        with _local_lock(f"{pointer}.lock"):
            _check_expected(root, read_current_version(root), expected, version_id)
            _atomic_write(fs, pointer, f"{version_id}\n".encode())
    elif hasattr(fs, "call_s3"):
        _swap_s3(fs, root, pointer, version_id, expected)
    else:  # no conditional write on this store: check, then write (documented limitation)
        _check_expected(root, read_current_version(root), expected, version_id)
        fs.pipe_file(pointer, f"{version_id}\n".encode())


def _check_expected(root: str, found: str | None, expected: str | None, version_id: str) -> None:
    if expected != ANY_PREVIOUS and found != expected:
        raise CommitConflict(
            f"{root}: _CURRENT moved to {found!r} while this run made {version_id!r} "
            f"(expected {expected!r}); version {version_id} is written but not current"
        )


def _swap_s3(fs: Any, root: str, pointer: str, version_id: str, expected: str | None) -> None:
    fs.invalidate_cache(pointer)
    etag = fs.info(pointer)["ETag"] if fs.exists(pointer) else None
    found = fs.cat_file(pointer).decode().strip() if etag else None
    _check_expected(root, found, expected, version_id)
    bucket, key, _ = fs.split_path(pointer)
    condition = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
    try:
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=f"{version_id}\n".encode(),
                   **condition)
    except OSError as error:  # 412 Precondition Failed: another commit won the race
        raise CommitConflict(f"{root}: another commit moved _CURRENT first ({error})") from error
    finally:
        fs.invalidate_cache(pointer)


@contextmanager
def _local_lock(path: str) -> Iterator[None]:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return bool({"file", "local"} & set(protocols))


def _atomic_write(fs: fsspec.AbstractFileSystem, path: str, data: bytes,
                  only_if_absent: bool = False) -> None:
    """Readers see the old file or the new one, never half (rename locally; one PUT on S3)."""
    if _is_local(fs):
        if only_if_absent and os.path.exists(path):
            raise FileExistsError(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    elif only_if_absent and hasattr(fs, "call_s3"):
        bucket, key, _ = fs.split_path(path)
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        fs.invalidate_cache(path)
    else:
        fs.pipe_file(path, data)


def file_sha256(uri: str) -> str:
    """Checksum of a whole file, streamed, as recorded per shard in the manifest."""
    digest = hashlib.sha256()
    with fsspec.open(uri, "rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
