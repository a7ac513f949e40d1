"""A chain's manifest is untrusted input too: a shard said to be in another version must
name an ancestor of the manifest's own lineage by version id, never a path, and the
recorded input listing must hash to the input fingerprint."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import (
    Delta,
    InputRecord,
    ManifestError,
    manifest_uri,
    read_manifest,
    shard_name,
    shard_uri,
    version_dir,
)
from preprocessing.storage.sources import InputFile, fingerprint_inputs
from preprocessing.versions.attempt import VersionAttempt
from preprocessing.versions.incremental import differences
from tests.preprocessing.version_writer import manifest_of, write_test_shard

PARENT, CHILD = "parent1", "child1"


def commit_of(root: Path, version_id: str, parent: str | None = None) -> None:
    """A two-shard version (a flat one, or a child listing the parent's shards too)."""
    with VersionAttempt(str(root), version_id) as attempt:
        entries = [
            write_test_shard(attempt.shard_uri(shard_name("train", i)), version_id, i)
            for i in range(2)
        ]
        manifest = manifest_of(version_id, entries)
        lineage = [Delta(version_id, parent, "", 1, 1, 1)]
        if parent is not None:
            older, _ = read_manifest(version_dir(str(root), parent))
            entries = [replace(e, version=parent) for e in older.split("train").shards] + entries
            lineage = [*older.lineage(), *lineage]
            manifest = replace(
                manifest,
                splits={"train": replace(manifest.split("train"), num_rows=200, shards=entries)},
                parent_version=parent,
            )
        attempt.commit(replace(manifest, deltas=lineage))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    commit_of(tmp_path, PARENT)
    commit_of(tmp_path, CHILD, parent=PARENT)
    return tmp_path


def rewrite_child(root: Path, change) -> None:
    path = Path(manifest_uri(str(root), CHILD))
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def test_a_child_resolves_its_parents_shards_in_the_parents_directory(root: Path) -> None:
    """Invariant: a child's entries from its parent resolve to files in `v-<parent>/`."""
    manifest, location = read_manifest(str(root))
    uris = [shard_uri(location, entry) for entry in manifest.split("train").shards]
    assert [Path(uri).parent.parent.name for uri in uris] == [f"v-{PARENT}"] * 2 + [
        f"v-{CHILD}"
    ] * 2
    assert all(Path(uri).exists() for uri in uris)


@pytest.mark.parametrize(
    "version, message",
    [
        ("../../outside", r"version.*is not a version id"),
        ("v-parent1/../x", r"is not a version id"),
        ("someone-else", r"'someone-else', which is not an ancestor"),
        (CHILD, r"'child1', which is not an ancestor"),
    ],
)
def test_a_shard_in_another_version_must_name_an_ancestor(
    root: Path, version: str, message: str
) -> None:
    """Invariant: a path, an unrelated version or the version itself as a shard's `version`
    fails the read with ManifestError naming the shard."""
    rewrite_child(root, lambda raw: raw["splits"]["train"]["shards"][0].update(version=version))
    with pytest.raises(ManifestError, match=message):
        read_manifest(str(root))


def test_parent_and_lineage_must_agree(root: Path) -> None:
    """Invariants: a parent other than the delta before the child's own, or a last delta
    of another version, fails the read."""
    rewrite_child(root, lambda raw: raw.update(parent_version="someone-else"))
    with pytest.raises(ManifestError, match=r"parent_version 'someone-else' is not the delta"):
        read_manifest(str(root))
    rewrite_child(root, lambda raw: raw.update(parent_version=PARENT))
    rewrite_child(root, lambda raw: raw["deltas"][-1].update(version_id=PARENT))
    with pytest.raises(ManifestError, match=r"the last delta names 'parent1'"):
        read_manifest(str(root))


def test_an_altered_input_listing_is_refused(tmp_path: Path) -> None:
    """Invariant: a listing that does not hash to the input fingerprint (a file's size
    edited, to pass a rewritten file off as unchanged) fails the incremental diff."""
    listed = [InputFile("file:///raw/a.parquet", "", "", 10, "1.0")]
    parent = replace(
        manifest_of(PARENT, []),
        input_fingerprint=fingerprint_inputs(listed),
        inputs=[InputRecord("file:///raw/a.parquet", 10, "1.0")],
    )
    config = ReshardConfig(dataset=DatasetSpec(inputs=["/raw"]), output_root=str(tmp_path))
    new, _ = differences(parent, "here", config, listed)  # the true listing passes
    assert new == []
    forged = replace(parent, inputs=[InputRecord("file:///raw/a.parquet", 11, "1.0")])
    with pytest.raises(ManifestError, match=r"here: the input listing does not match"):
        differences(forged, "here", config, listed)
