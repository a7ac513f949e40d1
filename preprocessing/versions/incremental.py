"""Which version a run makes, and its manifest: a flat version, or an incremental child
that costs a nightly run its new input files only.

`plan_increment` decides (full, reuse or append) from the listing and the current
manifest, `version_id_of` names the version, `version_manifest` assembles what the run
wrote, and `commit_following` commits a child only from its parent.

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
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pyarrow as pa
from fsspec.core import url_to_fs

from preprocessing.config import ReshardConfig, comparable_settings
from preprocessing.contract.commit import Commit, CommitConflict
from preprocessing.contract.manifest import (
    MANIFEST_NAME,
    Delta,
    InputRecord,
    Manifest,
    ManifestError,
    RejectedFile,
    SplitEntry,
    code_version,
    is_local,
    read_current_version,
    read_manifest,
    version_dir,
)
from preprocessing.exchange.staged_rows import DERIVED_SOURCE_COLUMN
from preprocessing.plan.counts import Counts
from preprocessing.plan.row_ids import DERIVED_ID_COLUMN
from preprocessing.plan.split import SplitPlan
from preprocessing.scan.feature_stats import InputError
from preprocessing.scan.inputs import FileScan
from preprocessing.storage.sources import InputFile, fingerprint_inputs
from preprocessing.toolbox.secrets import redact, redact_value
from preprocessing.versions.table import publish_current

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


def input_records(scans: list[FileScan]) -> list[InputRecord]:
    """The listing a manifest records: every scanned file, with an accepted file's ids."""
    return [
        InputRecord(
            s.file.uri,
            s.file.num_bytes,
            s.file.content_tag,
            list(s.id_range) if s.reason is None and s.id_range else None,
        )
        for s in scans
    ]


def delta_of(
    version_id: str,
    parent: Manifest | None,
    scans: list[FileScan],
    num_pieces: int,
    plans: dict[str, SplitPlan],
) -> Delta:
    """What this run adds: the files it read and, per split and stratum, rows in and out."""
    strata = {
        name: [
            [label, source, int(n), int(k)]
            for (label, source), n, k in zip(
                plan.strata, plan.input_rows, plan.output_rows, strict=True
            )
        ]
        for name, plan in plans.items()
    }
    return Delta(
        version_id,
        parent.version_id if parent else None,
        "",
        len(scans),
        sum(scan.file.num_bytes for scan in scans),
        num_pieces,
        strata,
    )


def _input_histograms(scans: list[FileScan]) -> tuple[dict[str, int], dict[str, int]]:
    classes: dict[str, int] = {}
    sources: dict[str, int] = {}
    for scan in scans:
        for totals, column in ((classes, "label"), (sources, "source")):
            for value, n in scan.counts.rows_by(column).items() if scan.reason is None else ():
                totals[str(value)] = totals.get(str(value), 0) + n
    return classes, sources


def version_manifest(
    config: ReshardConfig,
    version_id: str,
    fingerprint: str,
    scans: list[FileScan],
    schema: pa.Schema,
    plans: dict[str, SplitPlan],
    splits: dict[str, SplitEntry],
    timings: dict[str, float],
    features: dict[str, Any],
    parent: Manifest | None,
    num_pieces: int,
) -> Manifest:
    """The manifest of what a run wrote: a flat version's, or (with `parent`) a child's,
    the new files' version joined to everything the parent lists."""
    delta = delta_of(version_id, parent, scans, num_pieces, plans)
    manifest = _flat_manifest(
        config, version_id, fingerprint, scans, schema, plans, splits, timings, features, delta
    )
    return append_to(parent, manifest) if parent else manifest


def _flat_manifest(
    config: ReshardConfig,
    version_id: str,
    fingerprint: str,
    scans: list[FileScan],
    schema: pa.Schema,
    plans: dict[str, SplitPlan],
    splits: dict[str, SplitEntry],
    timings: dict[str, float],
    features: dict[str, Any],
    delta: Delta,
) -> Manifest:
    input_classes, input_sources = _input_histograms(scans)
    train = plans["train"]
    # Every class of any split: a class whose rows were all held out is still one the
    # holdout's labels must map to.
    labels = {label for plan in plans.values() for label, _ in plan.strata}
    return Manifest(
        version_id=version_id,
        label_column=config.dataset.label_column,
        source_column=config.dataset.source_column or DERIVED_SOURCE_COLUMN,
        id_column=config.dataset.id_column or DERIVED_ID_COLUMN,
        feature_columns=list(config.dataset.feature_columns),
        classes=sorted(labels, key=json_sort_key),
        sources=sorted({source for _, source in train.strata}, key=json_sort_key),
        arrow_schema=[{"name": f.name, "type": str(f.type)} for f in schema],
        splits=splits,
        seed=config.seed,
        config=redact_value(config.model_dump(mode="json")),
        input_fingerprint=fingerprint,
        input_class_counts=input_classes,
        input_source_counts=input_sources,
        rejected=[
            RejectedFile(redact(s.file.uri), redact(s.reason))
            for s in scans
            if s.reason is not None
        ],
        features=features,
        timings_s=timings,
        code_version=code_version(),
        inputs=input_records(scans),
        deltas=[delta],
    )


def json_sort_key(value: Any) -> tuple[int, Any]:
    """The order of a manifest's classes and sources: numbers by value, then text."""
    return (0, value) if isinstance(value, int | float) else (1, str(value))


def append_to(parent: Manifest, delta: Manifest) -> Manifest:
    """The child manifest: `delta` (a version of the new files alone, under the child's
    id, with the chain's features) joined to everything `parent` lists."""
    names = dict.fromkeys([*parent.splits, *delta.splits])
    return replace(
        delta,
        splits={name: _joined(parent, delta, name) for name in names},
        classes=sorted({*parent.classes, *delta.classes}, key=json_sort_key),
        sources=sorted({*parent.sources, *delta.sources}, key=json_sort_key),
        input_class_counts=_summed(parent.input_class_counts, delta.input_class_counts),
        input_source_counts=_summed(parent.input_source_counts, delta.input_source_counts),
        rejected=[*parent.rejected, *delta.rejected],
        parent_version=parent.version_id,
        inputs=sorted([*parent.inputs, *delta.inputs], key=lambda record: record.uri),
        deltas=[*parent.lineage(), *delta.deltas],
    )


def _joined(parent: Manifest, delta: Manifest, name: str) -> SplitEntry:
    """The parent's shards of split `name`, each naming the directory it is in, then the
    delta's own."""
    older = parent.splits[name].shards if name in parent.splits else []
    newer = delta.splits[name].shards if name in delta.splits else []
    shards = [
        entry if entry.version else replace(entry, version=parent.version_id) for entry in older
    ] + list(newer)
    return SplitEntry(sum(entry.num_rows for entry in shards), shards)


def _summed(first: dict[str, int], second: dict[str, int]) -> dict[str, int]:
    return {key: first.get(key, 0) + second.get(key, 0) for key in sorted({*first, *second})}


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
    it is no version), then the shards in its own directory, then that directory."""
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
    if is_local(fs):
        with suppress(OSError):  # not empty: another writer's files stay
            fs.rmdir(directory)
