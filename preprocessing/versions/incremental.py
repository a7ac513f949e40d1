"""Which version a run makes, and its manifest: a flat version, or an incremental child
that costs a nightly run its new input files only.

`plan_increment` decides (full, reuse or append) from the listing and the current
manifest and `version_id_of` names the version; `version_manifest` assembles what the run
wrote (preprocessing/versions/version_manifest.py), and `commit_following` commits a child
only from its parent (preprocessing/versions/chain_commit.py).

With `mode: incremental` a run compares the inputs with the listing the current version
recorded (`Manifest.inputs`: path, size and etag or mtime per file, the fields of the
input fingerprint). When they are that listing plus new files, and the settings and
ballast's version are the current version's, the run scans, plans and writes the new
files only and commits a child version: its manifest lists the parent's shards (entries
naming the ancestor whose directory holds them, no copy) and the new shards, with
`parent_version` and one `Delta` per version of the chain. A child's version id hashes
the inputs, the settings, the code version and the parent's id.

A rewritten or removed input, other settings or another ballast version is a change: the
run refuses naming it (`incremental.on_changed_inputs: refuse`) or makes a full version
(`rebuild`), never a child that would hold stale rows. A run compacts (a full reshard of
every input into one flat version, byte-identical to a fresh full reshard) when the chain
would pass `incremental.max_chain_length`, or when more than
`incremental.max_small_shard_fraction` of the current chain's training shards hold under
half the rows of its largest; `mode: full` compacts on demand.

The mix of a chain: every delta is planned on its own with the configured mix, and its
holdout draw is per file and row as always, so the chain's holdout is exactly a full
reshard's. What the union of the deltas meets, per weighting:

- `uniform` and `explicit` classes: each delta exact (its classes within one row of their
  targets); the union within one row per delta, when every delta holds every class (a
  class missing from a delta gets no rows from it);
- `natural` classes and sources, `max_oversample` unset: exact, every row once, as in a
  full reshard;
- `temperature`: approximate, each delta weighted by its own counts (count**(1/T) is not
  additive); the union is exact only where the deltas' class proportions agree;
- sources within a class: `uniform` and `explicit` as for classes; `natural` exact per
  delta, and over the union exact only under `natural` class weighting;
- `max_oversample`: a bound per delta, so a bound of the union.

The feature codec is a full reshard's: the parent stores its merged profiles, and the
child folds its new files into them (preprocessing/scan/feature_stats.py), as a full reshard folds
every file (the same vocabularies, lengths and null counts; means and deviations equal
to float rounding, as the files are folded in another order). Ids are checked unique
against the parent's files by their recorded id ranges.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Literal

import pyarrow as pa

from preprocessing.config import ReshardConfig
from preprocessing.contract.manifest import (
    FORMAT_VERSION,
    Manifest,
    ManifestError,
    code_version,
    read_manifest,
    version_dir,
)
from preprocessing.plan.counts import Counts
from preprocessing.scan.feature_stats import InputError
from preprocessing.scan.inputs import FileScan
from preprocessing.storage.sources import InputFile, fingerprint_inputs
from preprocessing.toolbox.secrets import redact_value
from preprocessing.toolbox.setting_marks import comparable_settings

_SHOWN = 5  # changes named in a refusal; the rest are counted


class InputsChanged(ValueError):
    """An incremental run found the current version's inputs or settings changed."""


@dataclass(frozen=True)
class Increment:
    """What a run makes: a `full` version, the current one again (`reuse`), or a child
    that appends `new_files` to `parent`; `reason` says why, for a person."""

    kind: Literal["full", "reuse", "append"]
    reason: str
    parent: Manifest | None = None
    new_files: list[InputFile] = field(default_factory=list)


def plan_increment(config: ReshardConfig, files: list[InputFile], current: str | None) -> Increment:
    """Decide from the listing and the manifest of the `current` version alone (no data
    read); InputsChanged when a change is found and `on_changed_inputs` is `refuse`."""
    if config.mode == "full":
        return Increment("full", "mode full: every input resharded")
    if current is None:
        return Increment("full", "no current version to append to")
    parent, location = read_manifest(version_dir(config.output_root, current))
    if parent.format_version < FORMAT_VERSION:  # a child lists its ancestors' shards in place
        return Increment(
            "full",
            f"reformat: {current} has shard format {parent.format_version}, this ballast "
            f"writes {FORMAT_VERSION} (split directories the Delta table's readers need): a "
            f"full reshard, not a child (docs/data-path.md)",
        )
    new, changes = differences(parent, location, config, files)
    if changes:
        if config.incremental.on_changed_inputs == "refuse":
            raise InputsChanged(_refusal(config.output_root, current, changes))
        return Increment("full", f"rebuild: {_listed(changes)}")
    if not new:
        return Increment("reuse", "no new input files", parent)
    if reason := compaction_reason(parent, config):
        return Increment("full", reason)
    return Increment("append", f"{len(new)} new input files appended to {current}", parent, new)


def version_id_of(fingerprint: str, config: ReshardConfig, increment: Increment) -> str:
    """The id of the version `increment` makes: the parent's when reused, else 16 hex
    digits of the hash of the inputs, the output-relevant settings, the code version and a
    child's parent id (so a flat version's id never depends on the chain it replaces)."""
    if increment.kind == "reuse" and increment.parent is not None:
        return increment.parent.version_id
    appended = increment.kind == "append" and increment.parent is not None
    parent = [increment.parent.version_id] if appended and increment.parent else []
    # Redacted: a hash of a password would let anyone holding the id test guesses at it.
    payload = [fingerprint, redact_value(config.output_settings()), code_version(), *parent]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def differences(
    parent: Manifest, location: str, config: ReshardConfig, files: list[InputFile]
) -> tuple[list[InputFile], list[str]]:
    """The files new since `parent`, and every change that forbids appending to it."""
    if not parent.inputs:
        return [], [f"version {parent.version_id} lists no inputs (made by an older ballast)"]
    check_listing(parent, location)
    listed = {record.uri: record for record in parent.inputs}
    new, changes = [], []
    for item in files:
        record = listed.pop(item.uri, None)
        if record is None:
            new.append(item)
        elif (record.num_bytes, record.content_tag) != (item.num_bytes, item.content_tag):
            changes.append(
                f"{item.uri} rewritten ({record.num_bytes} bytes, tag "
                f"{record.content_tag!r} then; {item.num_bytes}, "
                f"{item.content_tag!r} now)"
            )
    changes += [f"{uri} removed" for uri in listed]
    return new, changes + setting_changes(parent, config)


def check_listing(parent: Manifest, location: str) -> None:
    """The recorded listing must hash to the manifest's input fingerprint."""
    as_listed = [InputFile(r.uri, "", "", r.num_bytes, r.content_tag) for r in parent.inputs]
    if fingerprint_inputs(as_listed) != parent.input_fingerprint:
        raise ManifestError(
            f"{location}: the input listing does not match the manifest's "
            f"input_fingerprint; the manifest was altered"
        )


def setting_changes(parent: Manifest, config: ReshardConfig) -> list[str]:
    """Settings (and the code version) that differ from the ones `parent` was made with."""
    now = redact_value(config.output_settings())  # the manifest keeps them redacted
    recorded = comparable_settings(dict(parent.config))
    then = {name: value for name, value in recorded.items() if name in now}
    changed = [
        f"setting {name!r} is {now[name]!r}, was {then.get(name)!r}"
        for name in sorted(now)
        if now[name] != then.get(name)
    ]
    if parent.code_version != code_version():
        changed.append(f"made by {parent.code_version}, this is {code_version()}")
    return changed


def compaction_reason(parent: Manifest, config: ReshardConfig) -> str | None:
    """Why appending to `parent` would pass a compaction threshold, or None."""
    length = len(parent.deltas) + 1
    if length > config.incremental.max_chain_length:
        return (
            f"compaction: a child would make a chain of {length} versions, more than "
            f"incremental.max_chain_length={config.incremental.max_chain_length}"
        )
    rows = [shard.num_rows for shard in parent.split("train").shards]
    small = sum(2 * n < max(rows) for n in rows) / len(rows)
    if small > config.incremental.max_small_shard_fraction:
        return (
            f"compaction: {small:.0%} of the chain's training shards hold under half the "
            f"rows of its largest, more than incremental.max_small_shard_fraction="
            f"{config.incremental.max_small_shard_fraction}"
        )
    return None


def _refusal(root: str, current: str, changes: list[str]) -> str:
    return (
        f"{root}: cannot append to the current version {current}: {_listed(changes)}. "
        f"Set incremental.on_changed_inputs: rebuild (or mode: full) to reshard every input"
    )


def _listed(changes: list[str]) -> str:
    more = f" and {len(changes) - _SHOWN} more" if len(changes) > _SHOWN else ""
    return "; ".join(changes[:_SHOWN]) + more


def earlier_scans(parent: Manifest) -> list[FileScan]:
    """The parent's files as scans holding only what the checks across files read: the
    id ranges of its accepted files, and (on one, with no rows) the parent's classes."""
    scans = [
        FileScan(
            InputFile(r.uri, "", "", r.num_bytes, r.content_tag),
            id_range=(int(r.id_range[0]), int(r.id_range[1])),
        )
        for r in parent.inputs
        if r.id_range is not None
    ]
    if scans:
        scans[0] = replace(
            scans[0], counts=Counts.of((0, "train", label, None, 0) for label in parent.classes)
        )
    return scans


def check_schema(schema: pa.Schema, parent: Manifest) -> None:
    """The new files must make rows of the parent's schema."""
    found = [{"name": f.name, "type": str(f.type)} for f in schema]
    if found != parent.arrow_schema:
        raise InputError(
            f"the new input files have columns {found}, version "
            f"{parent.version_id} has {parent.arrow_schema}: they cannot be "
            f"appended; mode: full reshards every input"
        )
