"""The version-commit protocol under real faults, with a tiny writer in its own process
(tests/preprocessing/version_writer.py): SIGKILL after each commit step, racing writers
of one version, and the garbage collection of dead attempts' staging.
The same faults on a whole reshard are in test_kill.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from preprocessing.contract.commit import COMMIT_STEPS, KILL_AT_ENV
from preprocessing.contract.manifest import (
    MANIFEST_NAME,
    file_sha256,
    read_current_version,
    read_manifest,
    shard_uri,
    version_dir,
)
from preprocessing.versions.attempt import STAGING_DIR, VersionAttempt, collect_expired

REPO = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("version_writer.py")


def child_env(**extra: str) -> dict[str, str]:
    """This checkout first on the path of a child process (not an installed copy)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def write(
    root: Path,
    version_id: str,
    *flags: str,
    kill_at: str | None = None,
) -> subprocess.CompletedProcess[str]:
    env = child_env(**({KILL_AT_ENV: kill_at} if kill_at else {}))
    return subprocess.run(
        [sys.executable, str(WRITER), str(root), version_id, *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def hold(root: Path, version_id: str, heartbeat_s: float = 10.0) -> tuple[subprocess.Popen, str]:
    """A live process holding an attempt of `version_id`; returns it and the attempt's path."""
    process = subprocess.Popen(
        [
            sys.executable,
            str(WRITER),
            str(root),
            version_id,
            "--hold",
            "--heartbeat-s",
            str(heartbeat_s),
        ],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("holding "), line
    return process, line.split(" ", 1)[1].strip()


def staged_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / STAGING_DIR).rglob("*") if p.is_file())


def assert_committed(root: Path, version_id: str) -> None:
    """`_CURRENT` names the version, every listed shard has its recorded sha256 and size,
    and no staging is left."""
    assert read_current_version(str(root)) == version_id
    manifest, location = read_manifest(str(root))
    assert manifest.version_id == version_id
    for entry in manifest.split("train").shards:
        assert file_sha256(shard_uri(location, entry)) == entry.sha256
        assert Path(shard_uri(location, entry)).stat().st_size == entry.num_bytes
    assert staged_files(root) == []
    assert not (root / STAGING_DIR).exists()


@pytest.mark.slow
@pytest.mark.parametrize("step", COMMIT_STEPS)
def test_writer_killed_after_each_commit_step_is_finished_by_the_rerun(tmp_path, step) -> None:
    """Fault: SIGKILL right after `step` of the commit, with an older version current.
    Invariants: before the rerun no reader sees a half version (`_CURRENT` names the old
    version or, after the swap, the complete new one); the rerun exits 0, `_CURRENT`
    names the new version, every shard checks out, the dead attempt's staging is gone,
    and the old version is untouched."""
    root = tmp_path / "root"
    assert write(root, "old").returncode == 0
    killed = write(root, "new", kill_at=step)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    has_manifest = (Path(version_dir(str(root), "new")) / MANIFEST_NAME).exists()
    assert has_manifest == (step != "shards")
    assert read_current_version(str(root)) == ("new" if step == "swap" else "old")
    assert staged_files(root), "the killed attempt left its staging"
    rerun = write(root, "new")
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.strip() == ("committed" if step == "shards" else "already committed")
    assert_committed(root, "new")
    old, location = read_manifest(version_dir(str(root), "old"))
    assert all(file_sha256(shard_uri(location, e)) == e.sha256 for e in old.split("train").shards)


@pytest.mark.slow
def test_rerun_of_an_unfinished_commit_leaves_a_newer_current_version(tmp_path) -> None:
    """Fault: SIGKILL after the manifest of `new`, then `newer` is committed. Invariant:
    the rerun of `new` finishes nothing that would move `_CURRENT` back: it stays on the
    newer version, and `new` is readable through its own directory."""
    root = tmp_path / "root"
    assert write(root, "new", kill_at="manifest").returncode == -signal.SIGKILL
    assert write(root, "newer").returncode == 0
    rerun = write(root, "new")
    assert rerun.returncode == 0 and rerun.stdout.strip() == "already committed"
    assert read_current_version(str(root)) == "newer"
    assert read_manifest(version_dir(str(root), "new"))[0].version_id == "new"


@pytest.mark.slow
@pytest.mark.parametrize("round_number", range(2))
def test_racing_writers_of_one_version_all_exit_zero_and_one_commits(
    tmp_path, round_number
) -> None:
    """Fault: four processes write the same version at the same instant. Invariants: all
    exit 0; exactly one reports `committed` (it wrote the manifest), the others `already
    committed`; `_CURRENT` names the version; shards intact; no staging left."""
    root, start_at = tmp_path / "root", time.time() + 2.0
    racers = [
        subprocess.Popen(
            [sys.executable, str(WRITER), str(root), "raced", "--start-at", str(start_at)],
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outcomes = [(racer.wait(timeout=120), *racer.communicate()) for racer in racers]
    assert [code for code, _, _ in outcomes] == [0] * 4, [err for _, _, err in outcomes]
    states = sorted(out.strip() for _, out, _ in outcomes)
    assert states == ["already committed"] * 3 + ["committed"]
    assert_committed(root, "raced")


@pytest.mark.slow
def test_collect_expired_keeps_a_live_attempt_and_removes_a_killed_ones(tmp_path) -> None:
    """Fault: a process holding an attempt is SIGKILLed (its heartbeat still fresh).
    Invariants: the collector removes the dead attempt at once (its pid is gone on this
    host) and leaves the live attempt's directory and lease alone."""
    root = tmp_path / "root"
    live, live_path = hold(root, "v1")
    dead, dead_path = hold(root, "v1")
    try:
        dead.kill()
        dead.wait(timeout=30)
        removed = collect_expired(str(root))
        assert [Path(uri.removeprefix("file://")) for uri in removed] == [Path(dead_path)]
        assert not Path(dead_path).exists()
        assert (Path(live_path) / "_LEASE").exists()
    finally:
        live.kill()
        live.wait(timeout=30)


@pytest.mark.slow
def test_collect_expired_removes_a_stalled_holder_once_its_lease_expires(tmp_path) -> None:
    """Fault: a holder is frozen with SIGSTOP (alive, but its heartbeat stops). Invariants:
    after the expiry its attempt is removed; a live holder beating every 0.2 s is kept."""
    root = tmp_path / "root"
    live, live_path = hold(root, "v1", heartbeat_s=0.2)
    stalled, stalled_path = hold(root, "v1", heartbeat_s=0.2)
    try:
        os.kill(stalled.pid, signal.SIGSTOP)
        assert collect_expired(str(root), expiry_s=2.0) == []
        time.sleep(3.0)
        removed = collect_expired(str(root), expiry_s=2.0)
        assert [Path(uri.removeprefix("file://")) for uri in removed] == [Path(stalled_path)]
        assert (Path(live_path) / "_LEASE").exists()
    finally:
        for process in (live, stalled):
            process.kill()
            os.kill(process.pid, signal.SIGCONT)
            process.wait(timeout=30)


def test_collect_expired_judges_leaseless_leftovers_by_their_age(tmp_path) -> None:
    """Fault: staging without a lease (a run killed before its first heartbeat, or the
    layout before leases: pieces straight under `_staging/<version>/`). Invariant: such
    leftovers are removed only when older than the expiry."""
    staging = tmp_path / "root" / STAGING_DIR
    old_attempt, fresh_attempt = staging / "v1" / "old", staging / "v1" / "fresh"
    legacy_piece = staging / "v0" / "piece-000001.arrow"
    for directory in (old_attempt, fresh_attempt, legacy_piece.parent):
        directory.mkdir(parents=True)
    (old_attempt / "piece-000001.arrow").write_bytes(b"x")
    legacy_piece.write_bytes(b"x")
    hour_ago = time.time() - 3600
    for path in (old_attempt, legacy_piece):
        os.utime(path, (hour_ago, hour_ago))
    collect_expired(str(tmp_path / "root"), expiry_s=60.0)
    assert not old_attempt.exists() and not legacy_piece.exists()
    assert fresh_attempt.exists()


def test_a_discarded_part_is_gone_when_the_attempt_ends_and_the_rest_is_kept_till_then(
    tmp_path,
) -> None:
    """Invariants: `discard` removes its part of the attempt in a thread, which the
    attempt's end waits for; the attempt's other files stay until that end; discarding a
    part that does not exist (already removed) is no error."""
    root = tmp_path / "root"
    with VersionAttempt(str(root), "v1") as attempt:
        staged = Path(attempt.uri) / "exchange" / "round-0"
        staged.mkdir(parents=True)
        for index in range(50):
            (staged / f"part-{index:07d}.arrow").write_bytes(b"x" * 4096)
        (Path(attempt.uri) / "train-00000.parquet").write_bytes(b"shard")
        attempt.discard(f"{attempt.uri}/exchange")
        attempt.discard(f"{attempt.uri}/never-made")
        assert (Path(attempt.uri) / "train-00000.parquet").exists()
        assert (Path(attempt.uri) / "_LEASE").exists()
    assert not Path(attempt.uri).exists()
    assert not (root / STAGING_DIR).exists() or not any((root / STAGING_DIR).iterdir())
