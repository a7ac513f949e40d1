"""What a rerun takes over of a dead attempt, and what it keeps of it, without a cluster:
the attempt of the same version is taken over, another version's or a stale one removed;
a staged object or shard is kept only when it is listed at its receipt's size and hashes
to its receipt. Whole reshards killed and resumed are in test_kill.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pyarrow as pa
import pytest

from flows.cli.status import attempt_lines
from preprocessing.contract.shards import write_shard
from preprocessing.exchange.receipts import (
    kept_shards,
    listed_objects,
    read_object_receipt,
    write_shard_receipt,
)
from preprocessing.exchange.staged_objects import StagedObject, StagedWriter, ranges_intact
from preprocessing.toolbox.faults import PermanentError
from preprocessing.versions.attempt import HOLDER, LEASE_NAME, STAGING_DIR, VersionAttempt

SCHEMA = pa.schema([("id", pa.int64())])


def dead_attempt(root: Path, version_id: str, name: str, age_s: float) -> Path:
    """An attempt whose holder last beat `age_s` ago (past the lease expiry: dead), with
    one staged file."""
    path = root / STAGING_DIR / version_id / name
    path.mkdir(parents=True)
    lease = {"holder": HOLDER, "pid": 2**22 + 7, "heartbeat_at": time.time() - age_s}
    (path / LEASE_NAME).write_text(json.dumps(lease))
    (path / "train-00000.parquet").write_bytes(b"left by the dead run")
    return path


def test_a_rerun_takes_over_its_versions_dead_attempt_and_removes_the_others(tmp_path) -> None:
    """Invariants: with `resume_max_age_s` set, the rerun stages in the newest dead attempt
    of its own version younger than that age (its files there, its old directory gone);
    a dead attempt of another version and one older than the age are removed; without
    the setting nothing is taken over."""
    root = tmp_path / "root"
    newest = dead_attempt(root, "v1", "newest", age_s=400)
    older = dead_attempt(root, "v1", "older", age_s=900)
    stale = dead_attempt(root, "v1", "stale", age_s=7200)
    other = dead_attempt(root, "v0", "other", age_s=400)
    with VersionAttempt(str(root), "v1", resume_max_age_s=3600) as attempt:
        assert attempt.resumed_from is not None and attempt.resumed_from.endswith("/newest")
        assert (Path(attempt.uri) / "train-00000.parquet").read_bytes() == b"left by the dead run"
        assert not any(p.exists() for p in (newest, older, stale, other))
    assert not (root / STAGING_DIR).exists()
    dead_attempt(root, "v1", "again", age_s=400)
    with VersionAttempt(str(root), "v1") as fresh:
        assert fresh.resumed_from is None
        assert not (Path(fresh.uri) / "train-00000.parquet").exists()


def staged(tmp_path: Path, name: str) -> StagedObject:
    """An object of three destinations: rows 1-3, none, rows 4-5."""
    writer = StagedWriter(StagedObject(str(tmp_path / name), 0, 3, receipt=True), SCHEMA)
    writer.add_batches([pa.record_batch([pa.array([1, 2, 3])], schema=SCHEMA)])
    writer.add_batches([])
    writer.add_batches([pa.record_batch([pa.array([4, 5])], schema=SCHEMA)])
    writer.close()
    return writer.staged


def intact(staged: StagedObject, listed: dict, wanted: list[int] | None = None) -> bool:
    return ranges_intact(staged.uri, *listed[staged.uri.rsplit("/", 1)[-1]], wanted)


def test_a_staged_object_is_kept_only_whole_and_unchanged(tmp_path) -> None:
    """Invariants: a written object is listed with its receipt and matches its CRC-32s; one
    cut short is not listed; one with a flipped byte in its last destination is listed
    (same size) but not intact, though its first destination, the only bytes a reader of
    that one reads, is; one without a receipt (its task killed before the end) is not
    listed; a receipt whose content was changed or left empty (an older receipt), or asked
    for a destination it does not hold, vouches for nothing."""
    whole, cut, flipped, emptied = (staged(tmp_path, f"part-000000{i}.arrow") for i in range(4))
    Path(cut.uri).write_bytes(Path(cut.uri).read_bytes()[:-5])
    data = bytearray(Path(flipped.uri).read_bytes())
    data[-20] ^= 0xFF
    Path(flipped.uri).write_bytes(bytes(data))
    Path(tmp_path / "part-0000009.arrow").write_bytes(Path(whole.uri).read_bytes())
    listed = listed_objects(fsspec.filesystem("file"), str(tmp_path))
    assert sorted(listed) == [f"part-000000{i}.arrow" for i in (0, 2, 3)]
    assert intact(whole, listed) and intact(whole, listed, [2])
    assert not intact(whole, listed, [3])  # a destination the receipt does not hold
    assert not intact(flipped, listed) and not intact(flipped, listed, [2])
    assert intact(flipped, listed, [0, 1])
    (receipt,) = tmp_path.glob("part-0000003.arrow.*.done")
    content = bytearray(receipt.read_bytes())
    content[-1] ^= 0x01
    receipt.write_bytes(bytes(content))
    assert not intact(emptied, listed, [0])
    receipt.write_bytes(b"")
    assert not intact(emptied, listed, [0])


def test_a_shard_is_kept_only_when_its_receipt_vouches_for_its_bytes(tmp_path) -> None:
    """Invariants: of a write task's shards, one listed at its recorded size and hashing
    to its recorded sha256 is kept with its entry; one rewritten with other bytes of the
    same size, or missing, is not; a receipt naming a path outside the directory keeps
    nothing."""
    table = pa.table({"id": pa.array(range(100), pa.int64()), "label": ["a"] * 100})
    entries = [
        write_shard(str(tmp_path / f"train-0000{i}.parquet"), table.slice(i), 50, "label")
        for i in range(3)
    ]
    write_shard_receipt(str(tmp_path), 0, entries)
    damaged = tmp_path / "train-00001.parquet"
    damaged.write_bytes(bytes(reversed(damaged.read_bytes())))
    (tmp_path / "train-00002.parquet").unlink()
    listed = {p.name: (p.stat().st_size, None) for p in tmp_path.iterdir()}
    receipt = str(tmp_path / "receipts" / "write-0000000.json")
    assert kept_shards(receipt, str(tmp_path), listed) == entries[:1]
    record = json.loads(Path(receipt).read_text())
    record[0]["path"] = "../train-00000.parquet"
    Path(receipt).write_text(json.dumps(record))
    assert kept_shards(receipt, str(tmp_path), listed) == []


def test_status_names_a_dead_attempts_resume_command_and_not_a_running_ones(tmp_path) -> None:
    """Invariants: `ballast status` lists a dead attempt as dead with the command that
    resumes it, and a running one as running, without a command."""
    root = tmp_path / "root"
    dead_attempt(root, "v0", "killed", age_s=400)
    command = "ballast run reshard --config c.yaml"
    header, dead = attempt_lines(str(root), command)
    assert header == f"unfinished reshard attempts under {root}:"
    assert dead.startswith("  version v0 (dead, last heartbeat 400 s ago): 0 of ? map outputs")
    assert dead.endswith(f"written; resume: {command}")
    with VersionAttempt(str(root), "v1"):  # collects the dead one first
        _, running = attempt_lines(str(root), command)
    assert running.startswith("  version v1 (running, last heartbeat 0 s ago)")
    assert "resume:" not in running


class Refused(PermanentError, RuntimeError):
    """A failure no retry can change."""


def test_a_transient_failure_leaves_the_staging_to_a_retry_and_a_permanent_one_does_not(
    tmp_path,
) -> None:
    """Invariants: a resumable attempt left on a transient error keeps its staging with a
    released lease, which a retry in the same process (a Prefect retry) takes over at
    once; left on a permanent error, or not resumable, it is removed."""
    root = str(tmp_path / "root")
    for error, resumable in ((Refused("no"), 60.0), (RuntimeError("lost"), None)):
        with (
            contextlib.suppress(type(error)),
            VersionAttempt(root, "v1", resume_max_age_s=resumable) as attempt,
        ):
            Path(attempt.uri, "train-00000.parquet").write_bytes(b"staged")
            raise error
        assert not (tmp_path / "root" / STAGING_DIR).exists()
    with (
        contextlib.suppress(RuntimeError),
        VersionAttempt(root, "v1", resume_max_age_s=60.0) as failed,
    ):
        Path(failed.uri, "train-00000.parquet").write_bytes(b"staged")
        raise RuntimeError("the cluster was lost")
    assert (Path(failed.uri) / "train-00000.parquet").exists()
    with VersionAttempt(root, "v1", resume_max_age_s=60.0) as retry:
        assert (retry.resumed_from or "").endswith(failed.attempt_id)
        assert (Path(retry.uri) / "train-00000.parquet").read_bytes() == b"staged"
    assert not (tmp_path / "root" / STAGING_DIR).exists()


RECEIPT_WRITER = """
import sys
import fsspec
from preprocessing.exchange.receipts import object_receipt, write_object_receipt
fs, count = fsspec.filesystem("file"), 1 << 19  # ~6 MB of content: a write is not instant
for k in range(10_000):
    content, check = object_receipt(range(count + 1), [k] * count)
    write_object_receipt(fs, f"{sys.argv[1]}/part-{k:07d}.arrow", 1, check, content)
"""


@pytest.mark.slow  # starts a writer process to kill
@pytest.mark.parametrize("delay_s", [0.3, 0.45, 0.6, 0.75])
def test_a_process_killed_while_writing_a_receipt_leaves_none_torn(tmp_path, delay_s) -> None:
    """Invariant: SIGKILL of a process at any moment while it writes object receipts
    leaves every `.done` name it made readable whole: a rerun, or a watcher that sees the
    name, never meets an empty or half-written receipt (the name is what they trust)."""
    repo = Path(__file__).resolve().parents[2]
    writer = subprocess.Popen(
        [sys.executable, "-c", RECEIPT_WRITER, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    time.sleep(delay_s)
    writer.kill()
    writer.wait(timeout=30)
    fs = fsspec.filesystem("file")
    names = sorted(p.name for p in tmp_path.glob("*.done"))
    for name in names:
        size, check = name.split(".")[-3:-1]
        path = str(tmp_path / name.split(".arrow")[0]) + ".arrow"
        assert read_object_receipt(fs, path, int(size), check) is not None, name
