"""Receipts of the exchange's finished tasks, and their checks when a rerun resumes.

A staged object counts as written only once its receipt exists, a small object beside it,

    <round>/part-0000003.arrow.<bytes>.<check>.done

written after the object, so one listing of a round's prefix gives every object's size
and what it must hash to, with no read or HEAD per object. A write task, once all its
shards are written, writes `<attempt>/receipts/write-<first destination>.json` holding
their manifest entries (a shard's sha256, rows and counts) and, on S3, each shard's ETag.
A rerun of the version (preprocessing/driver/resume.py) keeps an object or a shard only
when it is listed at its receipt's size and its bytes match its receipt's check: a file
cut short, damaged, or left half-written by a killed task is never kept, its task runs
again and writes the same bytes. Receipts are untrusted input: a shard's name must be a
plain file name.

The check is, on local disk, a CRC-32 for a staged object and the sha256 for a shard
(CRC-32 costs 0.28 CPU-s per GB here against sha256's 0.66). A staged object's receipt
holds where each destination's bytes start and end and each range's CRC-32, its name the
CRC-32 of that content: a rerun reads back only the ranges of the destinations it still
has to write (after a kill at 90 % of the writes, a tenth of the staged bytes: reading
back all of them cost a cold 8 GB rerun 54 s, M47). On S3 it is the ETag the store gave
the object's PUT (an MD5 of the bytes, or of the parts' MD5s for a multipart upload), the
receipt empty: the listing that finds the object shows its ETag and size, so a rerun
verifies every staged object and shard of a prefix with one listing and reads nothing
back. A PUT is atomic, so a listed object is whole; its ETag must still match the
receipt's (an object rewritten since by other bytes, or a receipt of another object, is
not kept). Neither check is a defence against a forger, who could as well rewrite the
receipt.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict
from itertools import pairwise
from typing import Any

import numpy as np
from fsspec.core import url_to_fs

from preprocessing.contract.manifest import ShardEntry, check_entry, write_atomically
from preprocessing.storage.objects import etag

SHARD_RECEIPTS = "receipts"
ETAG_KEY = "etag"  # a shard receipt's record: the manifest entry, and the shard's ETag
_OBJECT_RECEIPT = re.compile(
    r"(?P<name>part-\d+\.arrow)\.(?P<bytes>\d+)\.(?P<check>[0-9a-f]{8}|[0-9a-f]{32}(-\d+)?)\.done"
)
CRC_DIGITS = 8  # a check this long is a CRC-32, read back to verify; longer, an ETag
CHUNK_BYTES = 1 << 22
_OFFSET, _CRC = np.dtype("<i8"), np.dtype("<u4")


def write_object_receipt(
    fs: Any, path: str, num_bytes: int, check: str, content: bytes = b""
) -> None:
    """Mark the staged object at `path` written, with its size and check (its ETag on S3,
    or the CRC-32 of `content`, `object_receipt`'s), once the object itself is. Written
    atomically: a receipt's name is what a rerun and a watcher trust, so a process killed
    mid-write must leave none rather than an empty or torn one."""
    write_atomically(fs, f"{path}.{num_bytes}.{check}.done", content)


def object_receipt(offsets: Sequence[int], crcs: Sequence[int]) -> tuple[bytes, str]:
    """A CRC-32 receipt's content, where each destination's bytes start and end in the
    object then each one's CRC-32, and its check: the content's own CRC-32 (hex)."""
    content = np.asarray(offsets, _OFFSET).tobytes() + np.asarray(crcs, _CRC).tobytes()
    return content, f"{zlib.crc32(content):08x}"


def read_object_receipt(
    fs: Any, path: str, num_bytes: int, check: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """The offsets and per-destination CRC-32s of the receipt of the object at `path`;
    None when it is unreadable, not `check`'s, or not of that shape."""
    try:
        content = read_small(fs, f"{path}.{num_bytes}.{check}.done")
    except OSError:
        return None
    count = (len(content) - _OFFSET.itemsize) // (_OFFSET.itemsize + _CRC.itemsize)
    split = _OFFSET.itemsize * (count + 1)
    if count < 0 or split + _CRC.itemsize * count != len(content):
        return None
    if f"{zlib.crc32(content):08x}" != check:
        return None
    return np.frombuffer(content[:split], _OFFSET), np.frombuffer(content[split:], _CRC)


def range_crcs(read: Callable[[int, int], Any], offsets: Sequence[int]) -> list[int]:
    """The CRC-32 of each byte range [offsets[i], offsets[i + 1]) that `read(start,
    stop)` gives, read CHUNK_BYTES at a time."""
    crcs = []
    for start, stop in pairwise(offsets):
        crc = 0
        for position in range(start, stop, CHUNK_BYTES):
            crc = zlib.crc32(read(position, min(position + CHUNK_BYTES, stop)), crc)
        crcs.append(crc)
    return crcs


def listing(fs: Any, prefix: str) -> dict[str, tuple[int, str | None]]:
    """Name -> (bytes, ETag or None) of what one listing of `prefix` shows (nothing when
    it is absent); a cached listing is dropped first (a retry in the same process)."""
    fs.invalidate_cache(prefix)
    try:
        entries = fs.ls(prefix, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    return {
        entry["name"].rstrip("/").rsplit("/", 1)[-1]: (
            int(entry.get("size") or 0),
            etag(entry.get("ETag")),
        )
        for entry in entries
    }


def listed_objects(fs: Any, prefix: str) -> dict[str, tuple[int, str]]:
    """Object name -> (bytes, check) of every object of one listing of `prefix` that has
    a receipt, is listed at its receipt's size and, when the check is an ETag, with that
    ETag: verified then; a CRC-32 check (`needs_read_back`) is `ranges_intact`'s
    (exchange/staged_objects.py)."""
    listed = listing(fs, prefix)
    found = {}
    for name in listed:
        if (match := _OBJECT_RECEIPT.fullmatch(name)) is None:
            continue
        num_bytes, check = int(match["bytes"]), match["check"]
        size, tag = listed.get(match["name"], (-1, None))
        if size == num_bytes and (needs_read_back(check) or tag == check):
            found[match["name"]] = (num_bytes, check)
    return found


def read_small(fs: Any, path: str) -> bytes:
    """The bytes of a small non-empty object (a receipt, a lease) in one GET: s3fs's
    `cat_file` asks the size first (a HEAD) unless given a range."""
    return bytes(fs.cat_file(path, start=0))


def needs_read_back(check: str) -> bool:
    """Whether a receipt's check is a CRC-32, which only reading the bytes verifies."""
    return len(check) == CRC_DIGITS


def shard_intact(uri: str, sha256: str) -> bool:
    """Whether the shard at `uri` hashes to `sha256` (False when unreadable)."""
    return _read(uri, lambda handle: hashlib.file_digest(handle, "sha256").hexdigest()) == sha256


def _read(uri: str, digest: Callable[[Any], str]) -> str | None:
    fs, path = url_to_fs(uri)
    try:
        with fs.open(path, "rb", block_size=1 << 22) as handle:
            return digest(handle)
    except (OSError, ValueError):
        return None


def write_shard_receipt(
    attempt_uri: str, first: int, entries: list[ShardEntry], etags: dict[str, str] | None = None
) -> None:
    """Mark the shards of the write task starting at destination `first` written, with
    each one's ETag where the store gave one (`etags`: shard name -> ETag)."""
    fs, path = url_to_fs(f"{attempt_uri}/{SHARD_RECEIPTS}/write-{first:07d}.json")
    tags = etags or {}
    records = [
        {**asdict(entry), **({ETAG_KEY: tags[entry.path]} if entry.path in tags else {})}
        for entry in entries
    ]
    write_atomically(fs, path, json.dumps(records).encode())


def kept_shards(
    receipt_uri: str, shards_uri: str, listed: dict[str, tuple[int, str | None]]
) -> list[ShardEntry]:
    """The entries of one write receipt whose shard (under `shards_uri`) is `listed`
    (name -> (bytes, ETag)) at its recorded size and with its recorded ETag, or, where
    the receipt has none (local disk), hashes to its recorded sha256 (the manifest's)."""
    fs, path = url_to_fs(receipt_uri)
    try:
        records = [dict(record) for record in json.loads(read_small(fs, path))]
        tags = [record.pop(ETAG_KEY, None) for record in records]
        entries = [check_entry(ShardEntry(**record), receipt_uri) for record in records]
    except (OSError, ValueError, TypeError):  # unreadable, or not a receipt of this code
        return []
    return [
        entry
        for entry, tag in zip(entries, tags, strict=True)
        if listed.get(entry.path, (-1, None))[0] == entry.num_bytes
        and (
            listed[entry.path][1] == tag
            if tag
            else shard_intact(f"{shards_uri}/{entry.path}", entry.sha256)
        )
    ]
