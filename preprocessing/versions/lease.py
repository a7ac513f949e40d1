"""A named lease on an output root: one holder at a time of a decision that the service
it concerns cannot make atomically (MLflow's aliases have no compare-and-set, so two
nights promoting one model name at once could each displace the champion they read).

    <root>/_leases/<name>/lease-000000000007     holder, pid, heartbeat, released

Generations are created, never replaced, by a conditional write
(`write_atomically(only_if_absent=True)`: a hard link locally, `If-None-Match: *` on S3, as
the version claim does, preprocessing/versions/claim.py): to take the lease a process
creates the generation after the newest one, and only when that one is released or
expired; of two that race for one generation exactly one wins. The holder renews its
generation's heartbeat every `ttl_s / 6` while it holds it and marks it released at the
end. A holder that dies leaves its generation unreleased: it expires `ttl_s` after its
last heartbeat (at once when its pid is gone on the same host), and the next waiter takes
the next generation. A holder that only stalled past the expiry finds a newer generation
at its next renewal and stops renewing (`lost`); a caller checks `held()` before its
last, irreversible step. A waiter that cannot take the lease within `wait_s` fails with
`LeaseBusy` (a conflict: exit status 3), naming the holder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from types import TracebackType
from typing import Any

from fsspec.core import url_to_fs

from preprocessing.contract.commit import CommitConflict
from preprocessing.storage.objects import write_atomically
from preprocessing.versions.attempt import HOLDER, process_alive

LEASES_DIR = "_leases"
PREFIX = "lease-"
GENERATION = re.compile(rf"{PREFIX}(\d{{12}})")
TTL_S = 120.0
POLL_S = 0.5


class LeaseBusy(CommitConflict):
    """Another run held the lease for longer than this run would wait."""


def lease_dir(root: str, name: str) -> str:
    """The folder of lease `name` under `root` (the name hashed: any string is safe)."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{root.rstrip('/')}/{LEASES_DIR}/{digest}"


class NamedLease:
    """`with NamedLease(root, name):` holds lease `name` on `root` (see the module)."""

    def __init__(self, root: str, name: str, wait_s: float = 900.0, ttl_s: float = TTL_S) -> None:
        self.name, self.wait_s, self.ttl_s = name, wait_s, ttl_s
        self.fs, self.path = url_to_fs(lease_dir(root, name))
        self.generation = 0
        self.waited_s = 0.0
        self.lost = False
        self._stopped = threading.Event()
        self._renewer = threading.Thread(target=self._renew, daemon=True, name="lease")

    def __enter__(self) -> NamedLease:
        self._take()
        self._renewer.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: TracebackType | None
    ) -> None:
        self._stopped.set()
        self._renewer.join()
        if not self.lost and self.held():
            write_atomically(self.fs, self._at(self.generation), self._record(released=True))

    def held(self) -> bool:
        """Whether no newer generation was taken (this holder was not judged dead)."""
        return not self.lost and self._newest()[0] == self.generation

    def _take(self) -> None:
        started = time.monotonic()
        self.fs.makedirs(self.path, exist_ok=True)
        while True:
            newest, record = self._newest()
            if record is None or is_free(record, self.ttl_s):
                try:
                    write_atomically(self.fs, self._at(newest + 1), self._record(), True)
                except FileExistsError:  # another waiter took that generation first
                    continue
                self.generation, self.waited_s = newest + 1, time.monotonic() - started
                return
            if time.monotonic() - started > self.wait_s:
                raise LeaseBusy(
                    f"{self.name}: held by pid {record.get('pid')} on "
                    f"{str(record.get('holder')).split('/')[0]} ({record.get('what')}) for "
                    f"over {self.wait_s:.0f} s; rerun once it is done"
                )
            time.sleep(POLL_S)

    def _renew(self) -> None:
        while not self._stopped.wait(self.ttl_s / 6):
            try:
                if not self.held():
                    self.lost = True  # judged dead while stalled: the new holder decides
                    return
                write_atomically(self.fs, self._at(self.generation), self._record())
            except OSError:  # a renewal missed; the lease expires only after ttl_s
                continue

    def _newest(self) -> tuple[int, dict[str, Any] | None]:
        self.fs.invalidate_cache(self.path)
        try:
            names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(self.path, detail=False)]
        except FileNotFoundError:  # an S3 prefix exists only once it holds an object
            return 0, None
        # Only whole generations: a local atomic write stages `<name>.tmp-*` beside them.
        generations = [int(m[1]) for n in names if (m := GENERATION.fullmatch(n))]
        if not generations:
            return 0, None
        newest = max(generations)
        try:
            return newest, json.loads(self.fs.cat_file(self._at(newest)))
        except (OSError, ValueError):  # unreadable: judged by its age like a silent one
            return newest, {"heartbeat_at": 0.0}

    def _at(self, generation: int) -> str:
        return f"{self.path}/{PREFIX}{generation:012d}"

    def _record(self, released: bool = False) -> bytes:
        record = {
            "holder": HOLDER,
            "pid": os.getpid(),
            "heartbeat_at": time.time(),
            "released": released,
            "what": self.name,
        }
        return json.dumps(record).encode()


def is_free(record: dict[str, Any], ttl_s: float) -> bool:
    """Whether a generation's holder let go: released, silent past `ttl_s`, or a process
    of this host (same boot and pid namespace) that is gone."""
    if record.get("released"):
        return True
    pid = int(record.get("pid") or 0)  # 0 or less would name a process group, not one
    if record.get("holder") == HOLDER and pid > 0 and not process_alive(pid):
        return True
    return bool(time.time() - float(record.get("heartbeat_at", 0.0)) > ttl_s)
