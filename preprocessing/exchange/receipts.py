"""Receipts of the exchange's finished tasks, and their checks when a rerun resumes.

A staged object counts as written only once its receipt exists: an empty object beside it,

    <round>/part-0000003.arrow.<bytes>.<sha256>.done

written after the object, so one listing of a round's prefix gives every object's size
and what it must hash to, with no read or HEAD per object. A write task, once all its
shards are written, writes `<attempt>/receipts/write-<first destination>.json` holding
their manifest entries (a shard's sha256, rows and counts). A rerun of the version
(preprocessing/driver/resume.py) keeps an object or a shard only when it is listed at its
receipt's size and its bytes hash to its receipt's sha256: a file cut short, damaged, or
left half-written by a killed task is never kept, its task runs again and writes the same
bytes. Receipts are untrusted input: a shard's name must be a plain file name.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict
from typing import Any

from fsspec.core import url_to_fs

from preprocessing.contract.manifest import ShardEntry, check_entry, write_atomically

SHARD_RECEIPTS = "receipts"
_OBJECT_RECEIPT = re.compile(
    r"(?P<name>part-\d+\.arrow)\.(?P<bytes>\d+)\.(?P<sha>[0-9a-f]{64})\.done"
)


def write_object_receipt(fs: Any, path: str, num_bytes: int, sha256: str) -> None:
    """Mark the staged object at `path` written, with its size and digest (called once the
    object itself is)."""
    fs.pipe_file(f"{path}.{num_bytes}.{sha256}.done", b"")


def listed_objects(fs: Any, prefix: str) -> dict[str, tuple[int, str]]:
    """Object name -> (bytes, sha256) of every object of one listing of `prefix` that has
    a receipt and is listed at its receipt's size (digests are checked by `intact`)."""
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
            found[match["name"]] = (num_bytes, match["sha"])
    return found


def intact(uri: str, sha256: str) -> bool:
    """Whether the object at `uri` hashes to `sha256` (streamed; False when unreadable)."""
    fs, path = url_to_fs(uri)
    try:
        with fs.open(path, "rb", block_size=1 << 22) as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest() == sha256
    except (OSError, ValueError):
        return False


def write_shard_receipt(attempt_uri: str, first: int, entries: list[ShardEntry]) -> None:
    """Mark the shards of the write task starting at destination `first` written."""
    fs, path = url_to_fs(f"{attempt_uri}/{SHARD_RECEIPTS}/write-{first:07d}.json")
    records = [asdict(entry) for entry in entries]
    write_atomically(fs, path, json.dumps(records).encode())


def kept_shards(receipt_uri: str, shards_uri: str, sizes: dict[str, int]) -> list[ShardEntry]:
    """The entries of one write receipt whose shard (under `shards_uri`) is listed at its
    recorded size (`sizes`: name -> bytes) and hashes to its recorded sha256."""
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
        and intact(f"{shards_uri}/{entry.path}", entry.sha256)
    ]
