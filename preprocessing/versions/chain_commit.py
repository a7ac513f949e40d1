"""A version committed in line with its chain: a flat version from whatever `_CURRENT`
named at the run's start, a chain's child only from its parent.

A child that finds `_CURRENT` moved on (before its commit, at the swap, or after finding
itself committed) is withdrawn (its manifest first, then its own shards and directory)
and `CommitConflict` raised, so a lost race leaves no version behind; then the root's
Delta table is brought in step with `_CURRENT` (preprocessing/versions/table.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from fsspec.core import url_to_fs

from preprocessing.contract.commit import Commit, CommitConflict
from preprocessing.contract.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    is_local,
    read_current_version,
    read_manifest,
    version_dir,
)
from preprocessing.versions.table import publish_current


def commit_following(
    root: str, manifest: Manifest, previous: str | None, commit: Callable[[str | None], Commit]
) -> Commit:
    """Run `commit(expected)`: a flat version from `previous`; a chain's child only from
    its parent. A child that finds `_CURRENT` moved on (before its commit, at the swap,
    or after finding itself committed) is withdrawn and CommitConflict raised: a lost
    race leaves no version behind. A child current or under the current one is kept.
    Then the root's table is brought in step with `_CURRENT` (a rerun's repair)."""
    done = _commit_in_line(root, manifest, previous, commit)
    publish_current(root)
    return done


def _commit_in_line(
    root: str, manifest: Manifest, previous: str | None, commit: Callable[[str | None], Commit]
) -> Commit:
    if manifest.parent_version is None:
        return commit(previous)
    if _position(root, manifest) == "elsewhere":
        raise _withdrawn(root, manifest)
    try:
        done = commit(manifest.parent_version)
    except CommitConflict as error:
        raise _withdrawn(root, manifest) from error
    if _position(root, manifest) != "current":
        raise _withdrawn(root, manifest)
    return done


def _position(root: str, manifest: Manifest) -> str:
    """`current` (the child, or a version under it, is current), `parent`, `elsewhere`."""
    found = read_current_version(root)
    if found == manifest.parent_version:
        return "parent"
    if found == manifest.version_id:
        return "current"
    try:
        lineage = read_manifest(version_dir(root, found))[0].deltas if found else []
    except ManifestError:
        return "elsewhere"
    return "current" if manifest.version_id in {d.version_id for d in lineage} else "elsewhere"


def _withdrawn(root: str, manifest: Manifest) -> CommitConflict:
    withdraw_version(root, manifest)
    return CommitConflict(
        f"{root}: _CURRENT names {read_current_version(root)!r}, not "
        f"{manifest.parent_version!r}, the version {manifest.version_id} appends to: another "
        f"run committed first. {manifest.version_id} was withdrawn; run again to append to "
        f"the current version"
    )


def withdraw_version(root: str, manifest: Manifest) -> None:
    """Remove a version that must never become current: its manifest first (from then on
    it is no version), then the shards in its own directory, then its directories."""
    fs, directory = url_to_fs(version_dir(root, manifest.version_id))
    own = [
        entry.path
        for split in manifest.splits.values()
        for entry in split.shards
        if entry.version is None
    ]
    for name in (MANIFEST_NAME, *own):
        with suppress(FileNotFoundError):
            fs.rm_file(f"{directory}/{name}")
    fs.invalidate_cache(directory)
    if is_local(fs):  # the split directories, then the version's; not empty: left as it is
        for folder in sorted({path.rpartition("/")[0] for path in own} - {""}):
            with suppress(OSError):  # another writer's files stay
                fs.rmdir(f"{directory}/{folder}")
        with suppress(OSError):
            fs.rmdir(directory)
