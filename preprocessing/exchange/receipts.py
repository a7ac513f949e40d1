"""Receipts of the exchange's finished tasks, and their checks when a rerun resumes.

A staged object counts as written only once its receipt exists: an empty object beside it,

    <round>/part-0000003.arrow.<bytes>.<crc32>.done

written after the object, so one listing of a round's prefix gives every object's size
and what it must hash to, with no read or HEAD per object. A write task, once all its
shards are written, writes `<attempt>/receipts/write-<first destination>.json` holding
their manifest entries (a shard's sha256, rows and counts). A rerun of the version
(preprocessing/driver/resume.py) keeps an object or a shard only when it is listed at its
receipt's size and its bytes match its receipt's checksum: a file cut short, damaged, or
left half-written by a killed task is never kept, its task runs again and writes the same
bytes. Receipts are untrusted input: a shard's name must be a plain file name.

A staged object's checksum is a CRC-32, a shard's its sha256 (the manifest's): every
staged byte is read back once more to compute it, and CRC-32 costs 0.28 CPU-s per GB here
against sha256's 0.66 (both with the CPU's instructions): on a 2 GB reshard, whose CPU
floor is 11.6 CPU-s, 0.6 CPU-s instead of 1.3. It finds a file cut short or damaged; it
is no defence against a forger, who could as well rewrite the receipt.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fsspec.core import url_to_fs

from preprocessing.contract.manifest import ShardEntry, check_entry, write_atomically

SHARD_RECEIPTS = "receipts"
_OBJECT_RECEIPT = re.compile(
    r"(?P<name>part-\d+\.arrow)\.(?P<bytes>\d+)\.(?P<crc>[0-9a-f]{8})\.done"
)


def write_object_receipt(fs: Any, path: str, num_bytes: int, crc: int) -> None:
    """Mark the staged object at `path` written, with its size and CRC-32 (called once the
    object itself is)."""
    fs.pipe_file(f"{path}.{num_bytes}.{crc:08x}.done", b"")


def crc32_of(handle: Any) -> int:
    """The CRC-32 of what is left to read of a binary file object."""
    crc = 0
    while chunk := handle.read(1 << 22):
        crc = zlib.crc32(chunk, crc)
    return crc


def listed_objects(fs: Any, prefix: str) -> dict[str, tuple[int, str]]:
    """Object name -> (bytes, CRC-32 in hex) of every object of one listing of `prefix`
    that has a receipt and is listed at its receipt's size (`object_intact` checks the
    CRC)."""
    try:
        listing = fs.ls(prefix, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    sizes = {entry["name"].rsplit("/", 1)[-1]: int(entry["size"]) for entry in listing}
    found = {}
    for name in sizes:
        if (match := _OBJECT_RECEIPT.fullmatch(name)) is None:
            continue
        num_bytes = int(match["bytes"])
        if sizes.get(match["name"]) == num_bytes:
            found[match["name"]] = (num_bytes, match["crc"])
    return found


def object_intact(uri: str, crc: str) -> bool:
    """Whether the staged object at `uri` has the CRC-32 `crc` (hex; False if unreadable)."""
    return _read(uri, lambda handle: f"{crc32_of(handle):08x}") == crc


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


def write_shard_receipt(attempt_uri: str, first: int, entries: list[ShardEntry]) -> None:
    """Mark the shards of the write task starting at destination `first` written."""
    fs, path = url_to_fs(f"{attempt_uri}/{SHARD_RECEIPTS}/write-{first:07d}.json")
    records = [asdict(entry) for entry in entries]
    write_atomically(fs, path, json.dumps(records).encode())


def kept_shards(receipt_uri: str, shards_uri: str, sizes: dict[str, int]) -> list[ShardEntry]:
    """The entries of one write receipt whose shard (under `shards_uri`) is listed at its
    recorded size (`sizes`: name -> bytes) and hashes to its recorded sha256 (the
    manifest's)."""
    fs, path = url_to_fs(receipt_uri)
    try:
        entries = [
            check_entry(ShardEntry(**record), receipt_uri)
            for record in json.loads(fs.cat_file(path))
        ]
    except (OSError, ValueError, TypeError):  # unreadable, or not a receipt of this code
        return []
    return [
        entry
        for entry in entries
        if sizes.get(entry.path) == entry.num_bytes
        and shard_intact(f"{shards_uri}/{entry.path}", entry.sha256)
    ]
