"""Whether a committed version and its chain are whole: what `ballast verify` reports.

`verify_chain(root, version, deep)` walks from a version (default: the one `_CURRENT`
names) through every parent and checks, per version:

- its manifest reads and validates (`read_manifest`: the id names its directory, plain
  shard paths, hex digests, a lineage that holds together), and its lineage continues
  its parent's (the parent's deltas are the child's, less the child's own);
- every shard held in its own directory: present, of the manifest's size, of the
  manifest's sha256, and with `deep` every page decoded with its checksum verified
  (preprocessing/contract/integrity.py) and the footer's row count the manifest's;
- every shard it lists from an ancestor: that ancestor lists the same file (path, size,
  sha256), so the chain never names bytes nobody checked.

Nothing is repaired: the report names each damaged version, shard and what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from preprocessing.contract.integrity import ShardRef, damaged_row_group, shard_version
from preprocessing.contract.manifest import (
    Manifest,
    ManifestError,
    ShardEntry,
    file_sha256,
    read_current_version,
    read_manifest,
    shard_uri,
    version_dir,
)


@dataclass(frozen=True)
class Damage:
    """One thing wrong: in `version`, its shard `shard` ("" for the manifest itself)."""

    version: str
    shard: str
    problem: str

    def line(self) -> str:
        where = f"shard {self.shard}" if self.shard else "manifest"
        return f"DAMAGED version {self.version} {where}: {self.problem}"


@dataclass
class ChainReport:
    """The versions walked (newest first), shards checked and everything found wrong."""

    versions: list[str] = field(default_factory=list)
    shards_checked: int = 0
    damage: list[Damage] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        return not self.damage

    def text(self) -> str:
        head = (
            f"{len(self.versions)} version(s) {' <- '.join(self.versions)}: "
            f"{self.shards_checked} shard(s) checked"
        )
        verdict = "whole" if self.whole else f"{len(self.damage)} problem(s)"
        return "\n".join([head, *(d.line() for d in self.damage), verdict])


def verify_chain(root: str, version: str | None = None, deep: bool = False) -> ChainReport:
    """Check `version` (default: `_CURRENT`'s) and every ancestor; see the module doc."""
    version = version or read_current_version(root)
    if version is None:
        raise ManifestError(f"{root}: no _CURRENT and no --version: nothing to verify")
    report, manifests = ChainReport(), {}
    child: Manifest | None = None
    current: str | None = version
    while current is not None and current not in manifests:
        report.versions.append(current)
        try:
            manifest, location = read_manifest(version_dir(root, current))
        except (ManifestError, OSError) as error:
            report.damage.append(Damage(current, "", str(error)))
            break
        manifests[current] = manifest
        _check_lineage(report, manifest, child)
        _check_own_shards(report, manifest, location, deep)
        child, current = manifest, manifest.parent_version
    for manifest in manifests.values():
        _check_borrowed(report, manifest, manifests)
    return report


def _check_lineage(report: ChainReport, parent: Manifest, child: Manifest | None) -> None:
    """The child's lineage less its own delta must be the parent's lineage."""
    if child is None:
        return
    mine = [delta.version_id for delta in child.deltas[:-1]]
    theirs = [delta.version_id for delta in parent.deltas]
    if mine != theirs:
        report.damage.append(
            Damage(
                child.version_id, "", f"its lineage {mine} does not continue its parent's {theirs}"
            )
        )


def _check_own_shards(report: ChainReport, manifest: Manifest, location: str, deep: bool) -> None:
    for split in manifest.splits.values():
        for entry in split.shards:
            if entry.version is None:
                uri = shard_uri(location, entry)
                report.shards_checked += 1
                if problem := shard_problem(ShardRef(uri, entry, shard_version(uri)), deep):
                    report.damage.append(Damage(manifest.version_id, entry.path, problem))


def shard_problem(ref: ShardRef, deep: bool) -> str:
    """What is wrong with one shard file ("" when nothing is)."""
    fs, path = url_to_fs(ref.uri)
    try:
        size = int(fs.size(path))
    except FileNotFoundError:
        return f"missing ({ref.uri})"
    if size != ref.entry.num_bytes:
        return f"{size} bytes, the manifest records {ref.entry.num_bytes} ({ref.uri})"
    digest = file_sha256(ref.uri)
    problems = (
        []
        if digest == ref.entry.sha256
        else [f"sha256 {digest}, the manifest records {ref.entry.sha256}"]
    )
    if deep:
        problems += _decode_problems(ref)
    return f"{'; '.join(problems)} ({ref.uri})" if problems else ""


def _decode_problems(ref: ShardRef) -> list[str]:
    """The row group that fails to decode under its page checksums, or a footer whose row
    count is not the manifest's."""
    fs, path = url_to_fs(ref.uri)
    with fs.open(path, "rb") as handle:
        if where := damaged_row_group(handle):
            return [where]
        handle.seek(0)
        rows = pq.ParquetFile(handle).metadata.num_rows
    if rows != ref.entry.num_rows:
        return [f"{rows} rows in its footer, the manifest records {ref.entry.num_rows}"]
    return []


def _check_borrowed(
    report: ChainReport, manifest: Manifest, manifests: dict[str, Manifest]
) -> None:
    """Every shard listed from an ancestor is listed, the same, by that ancestor."""
    for split in manifest.splits.values():
        for entry in split.shards:
            if entry.version is None:
                continue
            owner = manifests.get(entry.version)
            if owner is None:
                problem = f"held by version {entry.version}, which is not in the chain walked"
            elif _same_file(entry) not in {
                _same_file(e) for s in owner.splits.values() for e in s.shards if e.version is None
            }:
                problem = f"version {entry.version} does not list this file with this content"
            else:
                continue
            report.damage.append(Damage(manifest.version_id, entry.path, problem))


def _same_file(entry: ShardEntry) -> tuple[str, int, str]:
    return entry.path, entry.num_bytes, entry.sha256
