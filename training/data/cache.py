"""A bounded local disk cache of whole shard files, checked against the manifest's sha256.

`ShardCache(directory, max_bytes).open(uri, entry)` returns an open pyarrow
file of a local copy of the shard, downloading it first when the cache lacks
it. Rules:

- A copy enters the cache only whole and verified: the download streams into
  a temporary name while its sha256 is computed, a digest other than the
  manifest's raises `ShardChecksumError` naming the shard and both digests (and
  the temporary file is removed), a good copy is made read-only and renamed
  into place. Several processes on one machine can share a directory: a reader
  sees a complete file or none, and two processes fetching the same shard
  both rename identical bytes.
- Copies are named by their sha256, so a new dataset version that reuses a
  shard reuses its copy, and a stale copy can never be mistaken for new bytes.
  Only a validated digest (64 hex digits, `check_entry`) names a file: a
  manifest cannot make the cache write or remove anything outside its directory.
- On a hit the copy's size must equal the manifest's; a copy of another size
  (truncated by something outside ballast) is removed and downloaded again.
  Its content is not hashed again on every use: that would read each shard
  twice an epoch; a copy is written once, then only read.
- Before a download is moved into place, the least recently used copies (by
  access time, which every hit sets) are removed until it fits, under an
  exclusive lock on `<directory>/.lock` (`file_lock`): the complete copies never add up to
  more than `max_bytes`. A shard larger than the whole cache is read from its
  download and not kept. Handles are open before anything is removed, so a
  reader keeps its bytes even when its copy is evicted. Temporary files of
  downloads in flight do not count; those left by a killed process are
  removed after STALE_TEMP_S.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pyarrow as pa
from fsspec.core import url_to_fs

from preprocessing.contract.integrity import ShardDamaged, ShardRef, check_size, shard_version
from preprocessing.contract.manifest import ShardEntry, check_entry, file_lock

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 22
SUFFIX = ".parquet"
STALE_TEMP_S = 3600.0


class ShardChecksumError(ShardDamaged):
    """A shard whose bytes do not hash to the sha256 its manifest entry records."""


class ShardCache:
    """Verified local copies of shard files, at most `max_bytes` in all (LRU eviction)."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"cache max_bytes must be > 0, got {max_bytes}")
        self.directory, self.max_bytes = directory, max_bytes
        self.hits = self.downloads = self.evictions = 0
        self._guard = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}

    def __getstate__(self) -> dict[str, Any]:  # locks do not cross process boundaries
        return {key: value for key, value in self.__dict__.items() if key[0] != "_"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._guard, self._key_locks = threading.Lock(), {}

    def path_of(self, entry: ShardEntry) -> str:
        digest = check_entry(entry, f"cache {self.directory}").sha256
        return os.path.join(self.directory, f"{digest}{SUFFIX}")

    def open(self, uri: str, entry: ShardEntry) -> pa.NativeFile:
        """An open local copy of the shard at `uri`: from the cache, else downloaded into it."""
        path = self.path_of(entry)
        with self._lock_for(entry.sha256):
            handle = self._open_cached(path, entry)
            if handle is not None:
                self._count("hits")
                return handle
            temp = f"{path}.tmp-{uuid.uuid4().hex}"
            download(uri, entry, temp)
            self._count("downloads")
            return self._admit(temp, path, entry.num_bytes)

    def _admit(self, temp: str, path: str, size: int) -> pa.NativeFile:
        """Move a verified download into place, evicting least recently used copies first
        so the cache never holds more than `max_bytes`; a shard larger than the whole
        cache is read from its download and not kept."""
        handle = pa.OSFile(temp)  # opened first: its bytes stay readable whatever follows
        try:
            with file_lock(os.path.join(self.directory, ".lock")):
                if size <= self.max_bytes:
                    self._evict_down_to(self.max_bytes - size)
                    os.replace(temp, path)
        finally:
            with suppress(FileNotFoundError):
                os.remove(temp)
        return handle

    def _count(self, name: str) -> None:
        with self._guard:
            setattr(self, name, getattr(self, name) + 1)

    def _open_cached(self, path: str, entry: ShardEntry) -> pa.NativeFile | None:
        try:
            handle = pa.OSFile(path)
        except FileNotFoundError:
            return None
        if handle.size() == entry.num_bytes:
            with suppress(OSError):  # the access time orders eviction
                os.utime(path, ns=(time.time_ns(), os.stat(path).st_mtime_ns))
            return handle
        handle.close()
        log.warning("cached copy of shard %s has the wrong size; downloading it again", entry.path)
        with suppress(FileNotFoundError):
            os.remove(path)
        return None

    @contextmanager
    def _lock_for(self, key: str) -> Iterator[None]:
        """One download per shard at a time within this process."""
        with self._guard:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            yield

    def cached_bytes(self) -> int:
        return sum(size for _, _, size in self._copies())

    def _evict_down_to(self, limit: int) -> None:
        """Remove least recently used copies until at most `limit` bytes remain (the caller
        holds the directory lock)."""
        copies = sorted(self._copies())
        total = sum(size for _, _, size in copies)
        for _, path, size in copies:
            if total <= limit:
                return
            with suppress(FileNotFoundError):
                os.remove(path)
                self._count("evictions")
            total -= size

    def _copies(self) -> Iterator[tuple[int, str, int]]:
        """(access time, path, bytes) of every complete copy; drops stale temporary files."""
        now = time.time()
        with os.scandir(self.directory) as found:
            for item in found:
                with suppress(FileNotFoundError):
                    stat = item.stat()
                    if item.name.endswith(SUFFIX):
                        yield stat.st_atime_ns, item.path, stat.st_size
                    elif ".tmp-" in item.name and now - stat.st_mtime > STALE_TEMP_S:
                        os.remove(item.path)


def download(uri: str, entry: ShardEntry, temp: str) -> None:
    """Copy `uri` to the local file `temp`, verifying its sha256 on the way (a mismatch
    removes `temp` and raises ShardChecksumError); the copy is left read-only."""
    os.makedirs(os.path.dirname(temp), exist_ok=True)
    try:
        digest = copy_hashing(uri, temp)
    except BaseException:
        with suppress(FileNotFoundError):
            os.remove(temp)
        raise
    ref = ShardRef(uri, entry, shard_version(uri))
    try:
        check_size(ref, os.path.getsize(temp))
    except ShardDamaged:
        os.remove(temp)
        raise
    if digest != entry.sha256:
        os.remove(temp)
        raise ShardChecksumError(
            f"version {ref.version}: shard {entry.path} ({uri}) has sha256 {digest}, but "
            f"the manifest records {entry.sha256}; the shard is corrupt or was rewritten"
        )
    os.chmod(temp, 0o444)


def copy_hashing(uri: str, target: str) -> str:
    """Stream `uri` into the local file `target`; returns the sha256 of the bytes copied."""
    digest = hashlib.sha256()
    fs, path = url_to_fs(uri)
    with fs.open(path, "rb", block_size=CHUNK_BYTES) as source, open(target, "wb") as sink:
        while chunk := source.read(CHUNK_BYTES):
            digest.update(chunk)
            sink.write(chunk)
    return digest.hexdigest()
