"""The manifest of what a run wrote: a flat version's, or a chain's child's joined to
everything its parent lists.

`version_manifest` assembles it from the run's scans, plans, shard entries and feature
state; a child (preprocessing/versions/incremental.py decides when a run makes one) lists
its parent's shards, each naming by `version` the ancestor whose directory holds it, then
its own, with the parent's input listing, histograms and lineage carried over.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pyarrow as pa

from preprocessing.config import ReshardConfig
from preprocessing.contract.manifest import (
    Delta,
    InputRecord,
    Manifest,
    RejectedFile,
    SplitEntry,
    code_version,
)
from preprocessing.exchange.staged_rows import DERIVED_SOURCE_COLUMN
from preprocessing.plan.key_tally import KeyCounts, merge_keys, split_value_stats
from preprocessing.plan.row_ids import DERIVED_ID_COLUMN
from preprocessing.plan.split import SplitPlan
from preprocessing.scan.across_files import time_cut_of
from preprocessing.scan.inputs import FileScan
from preprocessing.toolbox.secrets import redact, redact_value


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
    exchange_keys: KeyCounts | None = None,
) -> Manifest:
    """The manifest of what a run wrote: a flat version's, or (with `parent`) a child's,
    the new files' version joined to everything the parent lists; `exchange_keys`: the
    content tally the exchange took (plan/key_tally.py), joined to the scans'."""
    delta = delta_of(version_id, parent, scans, num_pieces, plans, exchange_keys or {})
    cut = time_cut_of(scans, config.dataset, config.holdout_fraction)
    if cut is not None and config.dataset.holdout_column:
        delta = replace(delta, time_cut=cut.record(config.dataset.holdout_column))
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
    exchange_keys: KeyCounts | None = None,
) -> Delta:
    """What this run adds: the files it read and, per split and stratum, rows in and out;
    per split, its groups and duplicates, of the scans' tallies and `exchange_keys`."""
    tallies = [scan.keys for scan in scans if scan.reason is None] + [exchange_keys or {}]
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
        _with_dropped(
            split_value_stats(merge_keys(tallies)),
            scans,
        ),
    )


def _with_dropped(
    stats: dict[str, dict[str, float]], scans: list[FileScan]
) -> dict[str, dict[str, float]]:
    """`stats` with, under `duplicates: drop`, each split's `dropped_duplicates`: the input
    rows left out as copies of an earlier row of the night (`rows` and `duplicate_rows`
    count the input before the drop)."""
    dropped: dict[str, int] = {}
    for scan in scans:
        for split, n in scan.duplicates_dropped.items():
            dropped[split] = dropped.get(split, 0) + n
    if not dropped and not any(scan.content_pairs for scan in scans):
        return stats
    return {
        split: {**entry, "dropped_duplicates": dropped.get(split, 0)}
        for split, entry in stats.items()
    }


def _input_histograms(scans: list[FileScan]) -> tuple[dict[str, int], dict[str, int]]:
    classes: dict[str, int] = {}
    sources: dict[str, int] = {}
    for scan in scans:
        for totals, column in ((classes, "label"), (sources, "source")):
            for value, n in scan.counts.rows_by(column).items() if scan.reason is None else ():
                totals[str(value)] = totals.get(str(value), 0) + n
    return classes, sources


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
