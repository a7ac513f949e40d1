"""Map a function over Parquet files with Dask and commit the output as a dataset version.

Used for batch inference: the caller passes a picklable `transform` (pyarrow Table in,
Table out, e.g. predictions); this module knows nothing about models. Each task reads
one input file row group by row group (bounded input memory), writes one output part
(`preprocessing/contract/shards.py`, row groups of `rows_per_row_group`) into the
run's own attempt (`preprocessing/versions/attempt.py`), and returns its manifest entry (a task
that fails for a reason that may pass is run again: preprocessing/toolbox/faults.py); the
version is committed through `commit_version`, exactly as for a reshard. An input that
is a shard of a committed version (batch inference over a split) has its size checked
against its manifest before it is read and its page checksums verified on read, so a
damaged one fails the run with ShardDamaged naming it (preprocessing/contract/integrity.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from fsspec.core import url_to_fs

from preprocessing.contract.integrity import (
    ShardRef,
    check_size,
    located_damage,
    shard_version,
)
from preprocessing.contract.manifest import (
    Manifest,
    ManifestError,
    ShardEntry,
    SplitEntry,
    code_version,
    read_current_version,
    read_manifest,
    shard_directory,
    shard_name,
    shard_uri,
)
from preprocessing.contract.shards import ShardWriter
from preprocessing.driver.cluster import Executor, dask_client
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import iter_batches
from preprocessing.toolbox.faults import RetryPolicy, retrying
from preprocessing.toolbox.secrets import redact_value
from preprocessing.versions.attempt import VersionAttempt

Transform = Callable[[pa.Table], pa.Table]


@dataclass(frozen=True)
class OutputSpec:
    """What the output columns mean, for its manifest."""

    id_column: str
    label_column: str
    feature_columns: list[str]
    classes: list[Any]
    config: dict[str, Any]


def map_file(
    uri: str,
    out_uri: str,
    listed: ShardRef | None,
    transform: Transform,
    label_column: str,
    rows_per_row_group: int,
) -> ShardEntry:
    """Transform one file batch by batch into one part (preprocessing/contract/shards.py);
    `listed`: the input's manifest entry when it is a shard of a committed version (its
    size checked first, a page that fails its checksum named)."""
    if listed is not None:
        fs, path = url_to_fs(uri)
        check_size(listed, int(fs.size(path)))
    try:
        return _mapped(uri, out_uri, transform, label_column, rows_per_row_group)
    except (OSError, pa.ArrowException) as error:
        damage = located_damage(listed, error) if listed else None
        if damage is None:
            raise
        raise damage from error


def _mapped(
    uri: str, out_uri: str, transform: Transform, label_column: str, rows_per_row_group: int
) -> ShardEntry:
    writer = ShardWriter(out_uri, rows_per_row_group, label_column)
    rows = 0
    # A map's inputs are Parquet (its docstring), which no CsvReading touches, and no
    # dataset config names a reading here: a CSV given anyway reads as by default. For a
    # model that is no other answer: an empty category and a null under a fill policy both
    # encode as slot 0 (preprocessing/contract/codec.py), and only the label differs.
    for batch in iter_batches(uri, reading=CsvReading()):
        table = transform(pa.Table.from_batches([batch]))
        writer.write(table)
        rows += table.num_rows
    if not rows:
        raise ValueError(f"{uri}: no rows to map")
    return writer.close()


def listed_shards(inputs: list[str]) -> list[ShardRef | None]:
    """Per input, its manifest entry when it is a shard of a committed version (read once
    per version directory), else None (a plain file)."""
    refs: dict[str, ShardRef] = {}
    for directory in {shard_directory(uri) for uri in inputs if shard_version(uri) != "?"}:
        try:
            manifest, location = read_manifest(directory)
        except ManifestError:  # a directory named like a version but not one
            continue
        for split in manifest.splits.values():
            for entry in split.shards:
                uri = shard_uri(location, entry)
                refs[uri] = ShardRef(uri, entry, shard_version(uri))
    return [refs.get(uri) for uri in inputs]


def mapped_version_id(inputs: list[str], spec: OutputSpec) -> str:
    """Hash of the inputs, the output description (model, columns) and the code version."""
    payload = repr((sorted(inputs), spec.config, spec.label_column, code_version()))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def map_to_version(
    inputs: list[str],
    transform: Transform,
    output_root: str,
    spec: OutputSpec,
    executor: Executor,
    rows_per_row_group: int = 8_192,
) -> tuple[Manifest, str]:
    """Run `transform` over every input file on Dask (a client, or the config of a cluster
    to start or join); commit one version of the results."""
    version_id = mapped_version_id(inputs, spec)
    previous = read_current_version(output_root)
    with (
        VersionAttempt(output_root, version_id) as attempt,
        dask_client(executor, storage=[output_root]) as client,
    ):
        outputs = [attempt.shard_uri(shard_name("predictions", i)) for i in range(len(inputs))]
        futures = client.map(
            retrying(map_file, RetryPolicy()),
            inputs,
            outputs,
            listed_shards(inputs),
            transform=transform,
            label_column=spec.label_column,
            rows_per_row_group=rows_per_row_group,
            pure=False,
        )
        entries: list[ShardEntry] = client.gather(futures)
        commit = attempt.commit(_manifest(version_id, inputs, spec, entries), expected=previous)
    return commit.manifest, commit.location


def _manifest(
    version_id: str, inputs: list[str], spec: OutputSpec, entries: list[ShardEntry]
) -> Manifest:
    return Manifest(
        version_id=version_id,
        label_column=spec.label_column,
        source_column="",
        id_column=spec.id_column,
        feature_columns=spec.feature_columns,
        classes=spec.classes,
        sources=[],
        arrow_schema=[],
        seed=0,
        config=redact_value(spec.config),
        splits={"predictions": SplitEntry(sum(e.num_rows for e in entries), entries)},
        input_fingerprint=hashlib.sha256("\n".join(inputs).encode()).hexdigest(),
        input_class_counts={},
        input_source_counts={},
        code_version=code_version(),
    )
