"""A named lease on an output root (preprocessing/versions/lease.py): of any number of
runs that want it at once, one holds it at a time (their critical sections never
overlap and a read-modify-write under it loses no update), locally and on S3 (moto's
server, conditional PUTs); a holder that died is replaced once its lease expires; a
waiter that waits past its limit fails as a conflict naming the holder; a holder judged
dead while it stalled knows it lost."""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.contract.exit_status import CONFLICT, exit_status
from preprocessing.versions.lease import PREFIX, LeaseBusy, NamedLease, lease_dir


def contend(root: str, name: str, runs: int, hold_s: float) -> list[tuple[float, float]]:
    """`runs` threads take the lease at once, each incrementing a counter object under
    it (read, pause, write); returns each one's (start, end) inside the lease."""
    fs, counter = fsspec.core.url_to_fs(f"{root}/counter-{uuid.uuid4().hex}")
    fs.pipe_file(counter, b"0")
    spans: list[tuple[float, float]] = []

    def run() -> None:
        with NamedLease(root, name, wait_s=120):
            start = time.monotonic()
            value = int(fs.cat_file(counter))
            time.sleep(hold_s)
            fs.pipe_file(counter, str(value + 1).encode())
            spans.append((start, time.monotonic()))

    threads = [threading.Thread(target=run) for _ in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert int(fs.cat_file(counter)) == runs, "an update was lost: two held it at once"
    return spans


def disjoint(spans: list[tuple[float, float]]) -> bool:
    ordered = sorted(spans)
    return all(a[1] <= b[0] for a, b in itertools.pairwise(ordered))


@settings(max_examples=8, deadline=None)
@given(st.integers(2, 6), st.text(min_size=1, max_size=30))
def test_one_holder_at_a_time_locally(tmp_path_factory, runs: int, name: str) -> None:
    """Invariant: for any number of concurrent runs and any model name (hostile ones
    included: slashes, dots, unicode), critical sections never overlap and no update is
    lost; each generation is a new object."""
    root = str(tmp_path_factory.mktemp("root"))
    spans = contend(root, name, runs, 0.01)
    assert len(spans) == runs and disjoint(spans)
    generations = [p.name for p in Path(lease_dir(root, name)).iterdir()]
    assert sorted(generations) == [f"{PREFIX}{n:012d}" for n in range(1, runs + 1)]


def stale(root: str, name: str, heartbeat_at: float, holder: str = "elsewhere/x/y") -> None:
    """A generation 1 of a holder on another host, last heard from at `heartbeat_at`."""
    path = Path(lease_dir(root, name))
    path.mkdir(parents=True)
    record = {"holder": holder, "pid": 4242, "heartbeat_at": heartbeat_at, "released": False}
    (path / f"{PREFIX}{1:012d}").write_text(json.dumps(record))


def test_a_dead_holders_lease_is_taken_once_expired(tmp_path: Path) -> None:
    """Invariant: a lease left unreleased (its holder died) is taken after its expiry,
    as the next generation."""
    stale(str(tmp_path), "model:m", time.time() - 5)
    with NamedLease(str(tmp_path), "model:m", wait_s=30, ttl_s=2) as lease:
        assert lease.generation == 2 and lease.held()
        assert 0 <= lease.waited_s < 5


def test_a_waiter_past_its_limit_fails_as_a_conflict_naming_the_holder(tmp_path: Path) -> None:
    """Invariant: a live holder (fresh heartbeat) keeps the lease; a waiter gives up after
    `wait_s` with LeaseBusy, which exits 3 (conflict) and names the holder's host."""
    stale(str(tmp_path), "model:m", time.time() + 3600)
    with (
        pytest.raises(LeaseBusy, match="on elsewhere") as busy,
        NamedLease(str(tmp_path), "model:m", wait_s=1),
    ):
        pass
    assert exit_status(busy.value) == CONFLICT


def test_a_holder_judged_dead_knows_it_lost(tmp_path: Path) -> None:
    """Invariant: once a newer generation exists (another run took the lease while this
    holder stalled past its expiry), `held()` is False and the holder stops renewing."""
    with NamedLease(str(tmp_path), "model:m", ttl_s=0.6) as lease:
        newer = Path(lease_dir(str(tmp_path), "model:m")) / f"{PREFIX}{2:012d}"
        newer.write_text(json.dumps({"holder": "x", "pid": 1, "heartbeat_at": time.time()}))
        assert not lease.held()
        time.sleep(0.5)
        assert lease.lost


@pytest.fixture
def lease_bucket(s3_endpoint: str) -> Iterator[str]:
    fs = fsspec.filesystem("s3")
    name = f"lease-{uuid.uuid4().hex[:8]}"
    fs.mkdir(name)
    yield f"s3://{name}"


@pytest.mark.slow
def test_one_holder_at_a_time_on_s3(lease_bucket: str) -> None:
    """Invariant: on S3 (moto's server; conditional PUTs), five runs at once hold the lease
    one after the other and lose no update."""
    spans = contend(f"{lease_bucket}/root", "model:nightly", 5, 0.05)
    assert len(spans) == 5 and disjoint(spans)
