"""Damaged shards known by their names: size, sha256 and Parquet page checksums.

Part of the contract (`training/` and `tracking/` read shards through it). Three checks,
cheapest first, each raising `ShardDamaged` (a `ManifestError`, so permanent: no retry
reads other bytes) naming the version, the shard and what disagrees:

- size: the file's size against the manifest's `num_bytes`, before any byte is decoded
  (one stat locally, the HEAD an fsspec open makes anyway on S3). A shard cut short
  fails here, not with pyarrow's "magic bytes not found in footer".
- sha256: the whole file hashed against the manifest's digest (a full read: the
  loader's `read.verify: sha256`, `ballast verify`).
- page checksums: every writer of shards sets `PAGE_CHECKSUMS` (a CRC32 per data and
  dictionary page) and every read sets `VERIFY_PAGES`, so flipped bytes in a page's
  values are an error naming the shard and the row group, not wrong rows. Shards written
  before page checksums have none and are read as before (pyarrow checks only the pages
  that carry one).
- any other decode error (flipped bytes in a page header or the footer: pyarrow's thrift
  error) is ShardDamaged once the file's sha256 disagrees with the manifest's, checked
  again on that error only (`decode_damage`): a read cut on the way decodes wrong too,
  but leaves the file whole, and stays an error that may pass.

`ShardRef` is a shard's URI with its manifest entry and version, what a reader needs to
check it without the manifest.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from preprocessing.contract.manifest import (
    ManifestError,
    ShardEntry,
    read_manifest,
    shard_directory,
    shard_uri,
)
from preprocessing.storage.sources import VERIFY_PAGES as VERIFY_PAGES  # part of the API
from preprocessing.toolbox.faults import TransientError, classify

# The one writer option for page checksums: every shard writer passes **PAGE_CHECKSUMS to
# pq.write_table / pq.ParquetWriter (it changes shard bytes, not what they decode to).
PAGE_CHECKSUMS: dict[str, Any] = {"write_page_checksum": True}
VERIFY_MODES = ("size", "sha256", "none")
_CRC_FAILED = "CRC checksum verification failed"
_CHUNK_BYTES = 1 << 22


class ShardDamaged(ManifestError):
    """A committed shard whose bytes are not those its manifest entry records."""


@dataclass(frozen=True)
class ShardRef:
    """A shard's URI, its manifest entry and the version whose directory holds it."""

    uri: str
    entry: ShardEntry
    version: str


def shard_version(uri: str) -> str:
    """The version whose directory (`.../v-<id>/[split=<name>/]<shard>`) holds the shard
    at `uri`."""
    directory = shard_directory(uri).rsplit("/", 1)[-1]
    return directory[2:] if directory.startswith("v-") else "?"


def split_shards(dataset: str, split: str) -> list[ShardRef]:
    """Every shard of a split of a version, read through its manifest."""
    manifest, location = read_manifest(dataset)
    uris = [shard_uri(location, entry) for entry in manifest.split(split).shards]
    return [
        ShardRef(uri, entry, shard_version(uri))
        for uri, entry in zip(uris, manifest.split(split).shards, strict=True)
    ]


def check_size(ref: ShardRef, found: int) -> None:
    """ShardDamaged unless the file's `found` size is the manifest's."""
    if found != ref.entry.num_bytes:
        shorter = "shorter" if found < ref.entry.num_bytes else "longer"
        raise ShardDamaged(
            f"version {ref.version}: shard {ref.entry.path} ({ref.uri}) is {found} bytes, "
            f"{shorter} than the {ref.entry.num_bytes} its manifest records: the file is "
            f"damaged (cut short or overwritten); restore it or reshard the version"
        )


def handle_size(handle: Any) -> int:
    """The size of an open pyarrow or fsspec file."""
    size = handle.size
    return int(size() if callable(size) else size)


def check_sha256(ref: ShardRef, handle: Any) -> None:
    """ShardDamaged unless the open file's bytes hash to the manifest's digest; the damaged
    row group is named when page checksums find it. The handle is left at offset 0."""
    digest = hashlib.sha256()
    handle.seek(0)
    while chunk := handle.read(_CHUNK_BYTES):
        digest.update(chunk)
    handle.seek(0)
    if digest.hexdigest() != ref.entry.sha256:
        where = damaged_row_group(handle)
        handle.seek(0)
        raise ShardDamaged(
            f"version {ref.version}: shard {ref.entry.path} ({ref.uri}) has sha256 "
            f"{digest.hexdigest()}, but its manifest records {ref.entry.sha256}"
            f"{f'; {where}' if where else ''}: the file is damaged or was rewritten"
        )


def damaged_row_group(source: Any) -> str:
    """Which row group of a Parquet file fails to decode with page checksums verified
    (a sentence), or "" when every one decodes."""
    try:
        parquet = pq.ParquetFile(source, **VERIFY_PAGES)
    except (OSError, pa.ArrowException) as error:
        return f"its footer does not decode ({error})"
    for index in range(parquet.metadata.num_row_groups):
        try:
            parquet.read_row_group(index, use_threads=False)
        except (OSError, pa.ArrowException) as error:
            return f"row group {index} does not decode ({error})"
    return ""


def page_damage(
    ref: ShardRef, group: int, error: BaseException, verified: bool = True
) -> ShardDamaged | None:
    """The ShardDamaged a failed read of row group `group` means (see `decode_damage`);
    with `verified` False (a reader told not to check shards) only a page checksum's."""
    return decode_damage(ref, error, f"row group {group}", verified)


def located_damage(ref: ShardRef, error: BaseException) -> ShardDamaged | None:
    """The ShardDamaged a failed whole-file read of `ref` means (see `decode_damage`),
    naming the row group that fails its page checksums when one does."""
    return decode_damage(ref, error, "")


def decode_damage(
    ref: ShardRef, error: BaseException, where: str, hashed: bool = True
) -> ShardDamaged | None:
    """The ShardDamaged that `error`, raised while decoding `ref` (at `where`, or anywhere
    when ""), means; None when it may pass. A page checksum mismatch is damage. Any other
    error that is not of the storage's (a thrift header that does not decode, a footer
    that disagrees with the manifest) is damage when the file's sha256 is not the
    manifest's: hashing it again tells flipped bytes on disk from a read cut on the way
    (`hashed` False: not checked, None)."""
    if isinstance(error, ShardDamaged):
        return error
    refused = classify(error) == "permanent" and not isinstance(error, ManifestError)
    if isinstance(error, _STORAGE_ERRORS) or refused:
        return None
    crc = isinstance(error, OSError) and _CRC_FAILED in str(error)
    if not crc and not hashed:
        return None
    digest = "" if crc else _sha256_of(ref.uri)
    if not crc and digest == ref.entry.sha256:
        return None
    what = (
        "a page's checksum does not match its bytes"
        if crc
        else f"its sha256 is {digest}, not the manifest's {ref.entry.sha256}"
    )
    if not where:
        where = _located(ref.uri)
    place = f", {where}" if where else ""
    return ShardDamaged(
        f"version {ref.version}: shard {ref.entry.path} ({ref.uri}){place}: does not decode "
        f"({type(error).__name__}: {_first_line(error)}); {what}: the file is damaged"
    )


# Errors of the storage, not of the bytes: they say nothing about the file's content.
_STORAGE_ERRORS = (
    TransientError,
    ConnectionError,
    TimeoutError,
    FileNotFoundError,
    PermissionError,
)


def _sha256_of(uri: str) -> str:
    fs, path = url_to_fs(uri)
    digest = hashlib.sha256()
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _located(uri: str) -> str:
    """The row group of the file at `uri` that fails to decode, or ""."""
    fs, path = url_to_fs(uri)
    with fs.open(path, "rb") as handle:
        return damaged_row_group(handle)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def read_shard_table(ref: ShardRef, columns: list[str] | None = None) -> pa.Table:
    """A whole shard as a table, its size checked first and its page checksums on read."""
    fs, path = url_to_fs(ref.uri)
    check_size(ref, int(fs.size(path)))
    try:
        return pq.read_table(ref.uri, columns=columns, **VERIFY_PAGES)
    except (OSError, pa.ArrowException) as error:
        damage = located_damage(ref, error)
        if damage is None:
            raise
        raise damage from error
