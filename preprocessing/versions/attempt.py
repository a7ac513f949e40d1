"""One run's attempt at writing a version: private staging held by a lease, and safe GC.

    <root>/_staging/<version_id>/<attempt_id>/_LEASE    holder, pid, last heartbeat
    <root>/_staging/<version_id>/<attempt_id>/...       exchange files; shards (local roots)

Every attempt stages in its own directory, so concurrent runs of one version never share
or delete each other's files. On a local root the shards are written there too and
published into the version directory by hard link, never over a file already there
(a committed or concurrent attempt's copy stays untouched). On S3 each shard is one PUT
of identical bytes to its final key (atomic; concurrent attempts of one version must run
the same software: the version id includes ballast's version, not pyarrow's).

The attempt's process renews its lease every HEARTBEAT_S while it runs. A lease has
expired when its heartbeat is older than LEASE_EXPIRY_S, or when it was taken on this
host (same boot and pid namespace) by a process that no longer exists; `collect_expired`
removes only such attempts, and every new attempt runs it first. Lease-less leftovers
are judged by their modification time. See docs/reliability.md.

A run that resumes (`resume_max_age_s` set: the reshard) first takes over the newest dead
attempt of its own version whose last heartbeat is younger than that age: it claims it
(locally a rename to its own attempt id; on an object store a conditional PUT, then it
stages in it where it is: preprocessing/versions/claim.py), so of two reruns one gets it.
What is in it is kept only once verified (preprocessing/exchange/receipts.py). A dead attempt of
another version, or one older than the age, is removed as before, never reused. Such a
run that fails for a transient reason (a cluster lost, a store that kept failing, an
interrupt) keeps its staging and releases its lease (`released`: dead at once, on any
host), so that a retry of the same version, in this process (a Prefect retry) or
another, resumes it; a permanent or config error removes it, as a run's end always did.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from fsspec.core import url_to_fs

from preprocessing.contract.commit import ANY_PREVIOUS, Commit, commit_version
from preprocessing.contract.manifest import (
    Manifest,
    check_version_id,
    file_sha256,
    is_local,
    version_dir,
    write_atomically,
)
from preprocessing.toolbox.faults import PermanentError, is_permanent
from preprocessing.toolbox.secrets import redact
from preprocessing.versions.claim import claim_on_store
from preprocessing.versions.table import publish_current

log = logging.getLogger(__name__)

STAGING_DIR = "_staging"
LEASE_NAME = "_LEASE"
HEARTBEAT_S = 10.0
LEASE_EXPIRY_S = 300.0  # 30 missed heartbeats: a stalled store or a paused host, not a death


class StagingError(PermanentError, RuntimeError):
    """An attempt's staged output cannot be published as it is."""


@dataclass(frozen=True)
class Lease:
    """Who holds an attempt: `holder` says where `pid` names a process (see `_holder`)."""

    holder: str
    pid: int
    heartbeat_at: float  # unix seconds of the last renewal
    released: bool = False  # its run failed and left it to be resumed: dead now
    attempt_id: str = ""  # the holding attempt's own id (the one it was first staged as)


def _holder() -> str:
    """Host, boot and pid namespace of this process: where its pid means the same process.
    Without /proc a random token, so no other process ever judges it by pid."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return f"{socket.gethostname()}/{uuid.uuid4().hex}"
    return f"{socket.gethostname()}/{boot}/{namespace}"


HOLDER = _holder()


def staging_root(root: str) -> str:
    return f"{root.rstrip('/')}/{STAGING_DIR}"


class VersionAttempt:
    """`with VersionAttempt(root, version_id) as attempt:` stage under `attempt.uri`,
    write shards to `attempt.shard_uri(name)`, then `attempt.commit(manifest, expected)`.
    Leaving the block removes the attempt's staging, unless it is resumable and left on
    a transient error (then it is released for a retry to resume: see the module)."""

    def __init__(
        self,
        root: str,
        version_id: str,
        heartbeat_s: float = HEARTBEAT_S,
        resume_max_age_s: float | None = None,
    ) -> None:
        self.root = root.rstrip("/")
        self.version_id = check_version_id(version_id, root)
        started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        self.attempt_id = f"{started}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.uri = f"{staging_root(root)}/{version_id}/{self.attempt_id}"
        self._fs, self._path = url_to_fs(self.uri)
        self._local = is_local(self._fs)
        self._heartbeat_s = heartbeat_s
        self._stopped = threading.Event()
        self._beating = threading.Thread(target=self._beat, daemon=True, name="staging-lease")
        self._discarding: list[threading.Thread] = []
        self._resume_max_age_s = resume_max_age_s
        self.resumed_from: str | None = None  # the dead attempt taken over, if any
        self.taken_over = False  # a rerun claimed it while this run stalled (versions/claim.py)

    @property
    def resumable(self) -> bool:
        """Whether a rerun of this version may take this attempt over (and so its tasks
        should leave receipts of what they wrote)."""
        return self._resume_max_age_s is not None

    def __enter__(self) -> VersionAttempt:
        if self._resume_max_age_s is not None:
            self._take_over(self._resume_max_age_s)
        collect_expired(self.root)
        self.renew()
        self._beating.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stopped.set()
        self._beating.join()
        for thread in self._discarding:
            thread.join()
        if self.taken_over:  # the staging is the rerun's now
            return
        if error is not None and self.resumable and not is_permanent(error):
            self._release(error)
            return
        try:
            _remove(self._fs, self._path)
        except OSError as cleanup:
            if error is None:
                raise
            # The first error wins: a storage that refused the run refuses its cleanup too
            # (a read-only file system), and that must not replace the cause.
            failed = (redact(self.uri), redact(str(cleanup)), redact(str(error)))
            log.warning("staging %s not removed (%s); the run failed first: %s", *failed)
            return
        _remove_if_empty(self._fs, os.path.dirname(self._path))
        _remove_if_empty(self._fs, os.path.dirname(os.path.dirname(self._path)))

    def _release(self, error: BaseException) -> None:
        """Leave the staging to a retry of the version: a lease that says so (dead now)."""
        try:
            write_atomically(self._fs, f"{self._path}/{LEASE_NAME}", self._lease(released=True))
        except OSError as failed:  # its heartbeat stops: dead after LEASE_EXPIRY_S anyway
            log.warning("staging lease %s not released: %s", redact(self.uri), redact(str(failed)))
        log.warning(
            "staging %s kept for a rerun of version %s to resume (the run failed: %s)",
            redact(self.uri),
            self.version_id,
            redact(str(error) or type(error).__name__),
        )

    def _take_over(self, max_age_s: float) -> None:
        """Stage in the newest dead attempt of this version younger than `max_age_s`, if
        one can be claimed (see the module docstring); else in a new directory."""
        for dead, lease in dead_attempts(self._fs, os.path.dirname(self._path), max_age_s):
            if not self._claim(dead, lease):
                continue
            if not self._local:
                self.uri, self._path = self._fs.unstrip_protocol(dead), dead
            self.resumed_from = self._fs.unstrip_protocol(dead)
            log.info("resuming the dead attempt %s", redact(self.resumed_from))
            return

    def _claim(self, dead: str, lease: Lease) -> bool:
        """Whether this run won the dead attempt at `dead`: locally the rename of its
        directory, on an object store the conditional PUT of its claim (versions/claim.py),
        then this run's lease in it."""
        try:
            if not self._local and not claim_on_store(
                self._fs, dead, asdict(lease), self.attempt_id.encode()
            ):
                return False
            write_atomically(self._fs, f"{dead}/{LEASE_NAME}", self._lease())
            if self._local:
                os.rename(dead, self._path)
        except OSError:  # another rerun claimed it first, or a collector removed it
            return False
        return True

    def discard(self, uri: str) -> None:
        """Remove `uri`, a part of this attempt that nothing reads any more (the exchange's
        staged objects once every shard is written), in a thread from now on: deleting a
        local file frees its page-cache pages (about 0.25 s per GB, one core), which then
        overlaps the cluster's shutdown and the commit. `__exit__` waits for it, then
        removes whatever is left, this too if the thread failed."""
        path = url_to_fs(uri)[1]
        thread = threading.Thread(
            target=_discard, args=(self._fs, path), daemon=True, name="staging-discard"
        )
        thread.start()
        self._discarding.append(thread)

    def shard_uri(self, name: str) -> str:
        """Where a task writes shard `name`: staging on a local root, else its final key."""
        if self._local:
            return f"{self.uri}/{name}"
        return f"{version_dir(self.root, self.version_id)}/{name}"

    def commit(self, manifest: Manifest, expected: str | None = ANY_PREVIOUS) -> Commit:
        """Publish the staged shards (local roots), `commit_version`, then bring the root's
        Delta Lake table in step with `_CURRENT` (versions/table.py)."""
        if self._local:
            self._publish(manifest)
        commit = commit_version(self.root, manifest, expected)
        publish_current(self.root)
        return commit

    def renew(self) -> None:
        """Write this attempt's lease with a fresh heartbeat; on an object store, first
        read it back: another holder's lease there means a rerun claimed this attempt
        while this run stalled (versions/claim.py), which then stops renewing."""
        if not self._local and self._held_by_another():
            self.taken_over = True
            self._stopped.set()
            log.warning("staging %s was taken over by a rerun; left to it", redact(self.uri))
            return
        lease = self._lease()
        for tries_left in reversed(range(3)):
            try:
                write_atomically(self._fs, f"{self._path}/{LEASE_NAME}", lease)
                return
            except FileNotFoundError:  # a collector removed the new, empty parent meanwhile
                if not tries_left:
                    raise

    def _lease(self, released: bool = False) -> bytes:
        lease = Lease(HOLDER, os.getpid(), time.time(), released, self.attempt_id)
        return json.dumps(asdict(lease)).encode()

    def _held_by_another(self) -> bool:
        lease = read_lease(self._fs, f"{self._path}/{LEASE_NAME}")
        return lease is not None and lease.attempt_id not in ("", self.attempt_id)

    def _beat(self) -> None:
        while not self._stopped.wait(self._heartbeat_s):
            try:
                self.renew()
            except OSError as error:  # the next beat may get through; expiry allows 30 misses
                log.warning(
                    "staging lease %s not renewed: %s", redact(self.uri), redact(str(error))
                )

    def _publish(self, manifest: Manifest) -> None:
        target = url_to_fs(version_dir(self.root, self.version_id))[1]
        for split in manifest.splits.values():
            for entry in split.shards:
                if entry.version is not None:  # an ancestor's shard, in its own directory
                    continue
                _link_once(f"{self._path}/{entry.path}", f"{target}/{entry.path}", entry.sha256)


def _link_once(staged: str, final: str, sha256: str) -> None:
    """Publish `staged` as `final` unless `final` exists, which must hold the same bytes."""
    os.makedirs(os.path.dirname(final), exist_ok=True)  # the version's split directory
    try:
        os.link(staged, final)
        return
    except FileExistsError:  # a rerun after a kill, or a concurrent attempt published first
        pass
    if file_sha256(final) != sha256:
        raise StagingError(
            f"{final} exists with other bytes than this attempt's copy (sha256 {sha256}); "
            f"attempts of one version made different output: do they run the same software?"
        )


def collect_expired(root: str, expiry_s: float = LEASE_EXPIRY_S) -> list[str]:
    """Remove the staging of every attempt under `root` whose lease expired; their URIs."""
    fs, base = url_to_fs(staging_root(root))
    removed = []
    for version_path in _children(fs, base):
        for attempt in _children(fs, version_path):
            if lease_expired(fs, attempt, expiry_s):
                _remove(fs, attempt)
                removed.append(fs.unstrip_protocol(attempt))
        _remove_if_empty(fs, version_path)
    _remove_if_empty(fs, base)
    return removed


def dead_attempts(fs: Any, version_path: str, max_age_s: float) -> list[tuple[str, Lease]]:
    """The attempts of one version (under `version_path`) whose lease expired and whose
    last heartbeat is younger than `max_age_s`, with that lease, the newest first: what a
    rerun may resume. One listing, and one read of each lease."""
    found = []
    for attempt in _children(fs, version_path):
        lease = read_lease(fs, f"{attempt}/{LEASE_NAME}")
        if lease is None:
            continue
        age_s = time.time() - lease.heartbeat_at
        if age_s <= max_age_s and _expired(fs, attempt, lease, LEASE_EXPIRY_S):
            found.append((age_s, attempt, lease))
    return [(attempt, lease) for _, attempt, lease in sorted(found, key=lambda f: f[:2])]


def lease_expired(fs: Any, attempt: str, expiry_s: float = LEASE_EXPIRY_S) -> bool:
    """Whether the attempt at `attempt` is dead (see the module docstring)."""
    return _expired(fs, attempt, read_lease(fs, f"{attempt}/{LEASE_NAME}"), expiry_s)


def _expired(fs: Any, attempt: str, lease: Lease | None, expiry_s: float) -> bool:
    if lease is None:
        modified = _modified_at(fs, attempt)
        return modified is not None and time.time() - modified > expiry_s
    if lease.released:
        return True
    if lease.holder == HOLDER and not process_alive(lease.pid):
        return True
    return time.time() - lease.heartbeat_at > expiry_s


def read_lease(fs: Any, path: str) -> Lease | None:
    """The lease at `path`; None when absent, not yet written, or not a lease."""
    try:
        return Lease(**json.loads(fs.cat_file(path, start=0)))  # one GET, no HEAD
    except (OSError, ValueError, TypeError):  # absent, not yet written, or not a lease
        return None


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (a lease's holder judged by its pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _modified_at(fs: Any, path: str) -> float | None:
    try:
        return float(fs.modified(path).timestamp())
    except (OSError, NotImplementedError, ValueError, KeyError, AttributeError):
        return None  # an S3 prefix has no time: left alone


def _children(fs: Any, path: str) -> list[str]:
    try:
        return [str(name) for name in fs.ls(path, detail=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _remove(fs: Any, path: str) -> None:
    with suppress(FileNotFoundError):  # another collector was first
        fs.rm(path, recursive=True)
    fs.invalidate_cache(path)


def _discard(fs: Any, path: str) -> None:
    try:
        _remove(fs, path)
    except OSError as error:  # the attempt's own removal tries again, and raises
        log.debug("staging %s not removed early: %s", redact(path), redact(str(error)))


def _remove_if_empty(fs: Any, path: str) -> None:
    """Remove an empty local directory (atomic: fails if an attempt was just made in it)."""
    if is_local(fs):
        with suppress(OSError):
            os.rmdir(path)
