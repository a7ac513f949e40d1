"""Committing a chain's child under races and faults: two runs from one parent, a child
losing the swap, a child killed after each commit step (the faults in docs/reliability.md)."""

from __future__ import annotations

import signal
import threading

import pytest

from preprocessing.contract.commit import COMMIT_STEPS, KILL_AT_ENV, CommitConflict
from preprocessing.contract.manifest import (
    CURRENT_NAME,
    file_lock,
    read_current_version,
    read_manifest,
)
from preprocessing.driver.reshard import run_reshard, version_id_for
from preprocessing.versions.attempt import STAGING_DIR
from tests.preprocessing.nightly import add_night, config_for
from tests.preprocessing.test_kill import assert_committed, kill_session, output, start_reshard

pytestmark = pytest.mark.slow  # every test here uses the session Dask cluster


def test_two_children_of_one_parent_one_commits_the_other_leaves_nothing(
    base_version, dask_client
) -> None:
    """Fault: run A lists the inputs (parent P current) and is held at its first progress
    report; a file is added and run B commits a child of P; A resumes. Invariants: A fails
    with CommitConflict naming P and B; `_CURRENT` names B; A's version has no directory
    and no staging; B's version reads back."""
    raw, root, base = base_version
    add_night(raw, 0)
    reached, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def hold(stage: str, done: int, total: int) -> None:
        reached.set()
        release.wait(120)

    def run_a() -> None:
        try:
            outcome["a"] = run_reshard(config_for(raw, root), dask_client, progress=hold)
        except CommitConflict as error:
            outcome["error"] = error

    thread = threading.Thread(target=run_a)
    thread.start()
    assert reached.wait(120)
    add_night(raw, 1)
    winner = run_reshard(config_for(raw, root), dask_client)
    release.set()
    thread.join(120)
    assert "a" not in outcome, "both children committed"
    message = str(outcome["error"])
    assert base.manifest.version_id in message and winner.manifest.version_id in message
    assert read_current_version(str(root)) == winner.manifest.version_id
    assert {p.name for p in root.glob("v-*")} == {
        f"v-{base.manifest.version_id}",
        f"v-{winner.manifest.version_id}",
    }
    assert not (root / STAGING_DIR).exists()
    assert read_manifest(str(root))[0].parent_version == base.manifest.version_id


def test_a_child_that_loses_the_swap_is_withdrawn(base_version, dask_client) -> None:
    """Fault: `_CURRENT`'s lock is held while a child commits, so its manifest is written
    and its swap waits; `_CURRENT` is moved to another version meanwhile. Invariants:
    CommitConflict; the child's manifest, shards and directory are gone; `_CURRENT` keeps
    the other version."""
    raw, root, base = base_version
    add_night(raw, 0)
    outcome: dict[str, object] = {}

    def run_child() -> None:
        try:
            outcome["result"] = run_reshard(config_for(raw, root), dask_client)
        except CommitConflict as error:
            outcome["error"] = error

    with file_lock(str(root / f"{CURRENT_NAME}.lock")):
        thread = threading.Thread(target=run_child)
        thread.start()
        for _ in range(1200):
            written = [
                p
                for p in root.glob("v-*/_MANIFEST.json")
                if p.parent.name != f"v-{base.manifest.version_id}"
            ]
            if written:
                break
            thread.join(0.1)
        assert written, "the child never wrote its manifest"
        (root / CURRENT_NAME).write_text("another0version\n")
    thread.join(120)
    assert isinstance(outcome.get("error"), CommitConflict)
    assert not written[0].parent.exists()
    assert (root / CURRENT_NAME).read_text().strip() == "another0version"


@pytest.mark.slow
@pytest.mark.parametrize("step", COMMIT_STEPS)
def test_a_child_killed_after_each_commit_step_is_finished_by_the_rerun(
    step, base_version, tmp_path, dask_client
) -> None:
    """Fault: `python -m preprocessing` appending a night SIGKILLs itself right after `step`
    of the commit. Invariants: until the rerun `_CURRENT` names the parent, or (after the
    swap) the complete child; the rerun commits that child from the parent, `_CURRENT`
    names it, every shard of the chain checks out, and no staging is left."""
    raw, root, base = base_version
    add_night(raw, 0)
    config = config_for(raw, root)
    child_id = version_id_for(config)
    process = start_reshard(config, tmp_path, **{KILL_AT_ENV: step})
    assert process.wait(timeout=300) == -signal.SIGKILL, output(tmp_path)[1]
    kill_session(process)
    expected = child_id if step == "swap" else base.manifest.version_id
    assert read_current_version(str(root)) == expected
    rerun = run_reshard(config, dask_client)
    assert rerun.manifest.version_id == child_id
    assert rerun.manifest.parent_version == base.manifest.version_id
    assert_committed(root, child_id)
