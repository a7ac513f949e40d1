"""The reshard driver: scan, plan, exchange and commit one dataset version, on Dask.

`run_reshard(config)` is the whole stage; Dask only executes the pure steps of
`scan`, `plan`, `resample` and `exchange`. The version id hashes the input
listing, the config (minus settings that cannot change the output) and the code
version, so re-running on unchanged inputs finds the committed manifest and
does no work. Each run stages in its own attempt directory
(`preprocessing/staging.py`) and commits through `commit_version` (shards, the
manifest last, then `_CURRENT`): a run killed at any point leaves no visible
version, and the rerun finishes whatever step it died after.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
from distributed import Client, as_completed
from tqdm import tqdm

from preprocessing.config import ReshardConfig
from preprocessing.exchange import (
    DERIVED_SOURCE_COLUMN,
    Bucket,
    PieceTask,
    map_piece,
    reduce_shard,
)
from preprocessing.executor import DaskConfig, Executor, dask_client
from preprocessing.manifest import (
    Manifest,
    ManifestError,
    RejectedFile,
    ShardEntry,
    SplitEntry,
    code_version,
    commit_version,
    read_current_version,
    read_manifest,
    shard_name,
    version_dir,
)
from preprocessing.plan import SplitPlan, plan_split
from preprocessing.profile import InputError
from preprocessing.retry import retrying
from preprocessing.scan import (
    FileScan,
    check_classes,
    check_schemas,
    count_records,
    duplicate_ids,
    feature_state,
    overlapping_id_groups,
    scan_file,
)
from preprocessing.secrets import redact, redact_value
from preprocessing.sources import fingerprint_inputs, list_inputs
from preprocessing.staging import VersionAttempt, collect_expired

Progress = Callable[[str, int, int], None]

# Settings that change how fast or where a version is made, never what is in it.
_OUTPUT_NEUTRAL_FIELDS = {"num_workers", "output_root", "retry"}


class TooManyRejected(RuntimeError):
    """More input files were bad than `max_rejected_fraction` allows."""


class InputsUnreadable(RuntimeError):
    """Input files still unreadable after every try, for reasons that may pass: no version
    is committed without them (a rerun reads them again)."""


@dataclass(frozen=True)
class ReshardResult:
    """The committed version, where its manifest is, and whether this run made it."""

    manifest: Manifest
    manifest_uri: str
    reused: bool


def compute_version_id(fingerprint: str, config: ReshardConfig) -> str:
    """Hash of inputs + output-relevant config + code version (16 hex digits)."""
    # Redacted: a hash of a password would let anyone holding the id test guesses at it.
    settings = redact_value(config.model_dump(mode="json", exclude=_OUTPUT_NEUTRAL_FIELDS))
    payload = json.dumps([fingerprint, settings, code_version()], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def version_id_for(config: ReshardConfig) -> str:
    """The id the version of `config` has or will have: lists the inputs, reads no data."""
    return compute_version_id(fingerprint_inputs(list_inputs(config.dataset, config.retry)),
                              config)


def version_is_committed(output_root: str, version_id: str) -> bool:
    """Whether version `version_id` is committed under `output_root` already."""
    return _committed(output_root, version_id) is not None


def run_reshard(config: ReshardConfig, executor: Executor | None = None,
                progress: Progress | None = None) -> ReshardResult:
    """Make (or find) the dataset version for `config` and commit it.

    `executor`: a Dask client, or the config of a cluster to start or join; by default a
    local cluster of `config.num_workers` processes. `progress(stage, done, total)` is
    called as tasks finish (an orchestrator shows it). A version found committed is
    reused, and a commit an earlier attempt left unfinished (`_CURRENT` behind, staging of
    a dead attempt) is finished first.
    """
    files = list_inputs(config.dataset, config.retry)
    fingerprint = fingerprint_inputs(files)
    version_id = compute_version_id(fingerprint, config)
    previous = read_current_version(config.output_root)
    existing = _committed(config.output_root, version_id)
    if existing is not None:
        collect_expired(config.output_root)
        commit = commit_version(config.output_root, existing, expected=previous)
        return ReshardResult(commit.manifest, commit.location, reused=True)
    with VersionAttempt(config.output_root, version_id) as attempt:
        manifest = _make_version(config, files, fingerprint, attempt, executor, progress)
        commit = attempt.commit(manifest, expected=previous)
    return ReshardResult(commit.manifest, commit.location, reused=not commit.written)


def _make_version(config: ReshardConfig, files: list[Any], fingerprint: str,
                  attempt: VersionAttempt, executor: Executor | None,
                  progress: Progress | None) -> Manifest:
    """Scan, plan, exchange and write the shards into `attempt`; the version's manifest."""
    timings: dict[str, float] = {}
    if executor is None:
        executor = DaskConfig(kind="local", num_workers=config.num_workers)
    with dask_client(executor, storage=[config.output_root]) as dask:
        scans = _timed(timings, "scan_s", lambda: _scan(dask, files, config, progress))
        features = feature_state(scans, config.dataset)
        schema = _output_schema(scans, config)
        plans, pieces = _timed(timings, "plan_s", lambda: _plan(scans, config))
        buckets = _timed(timings, "exchange_s", lambda: _exchange(
            dask, scans, plans, pieces, config, attempt, progress))
        splits = _timed(timings, "write_s", lambda: _reduce(
            dask, plans, buckets, schema, config, attempt, progress))
    return _manifest(config, attempt.version_id, fingerprint, scans, schema, plans, splits,
                     timings, features)


def _committed(root: str, version_id: str) -> Manifest | None:
    try:
        return read_manifest(version_dir(root, version_id))[0]
    except ManifestError:
        return None


def _timed(timings: dict[str, float], name: str, step: Any) -> Any:
    start = time.perf_counter()
    result = step()
    timings[name] = round(time.perf_counter() - start, 3)
    return result


def _progress(futures: list[Any], stage: str, progress: Progress | None) -> list[Any]:
    """Gather futures in submission order; a progress bar when run from a terminal, and
    `progress(stage, done, total)` for an orchestrator."""
    bar = tqdm(total=len(futures), desc=stage, unit="task", disable=not sys.stderr.isatty())
    for done, _ in enumerate(as_completed(futures), start=1):
        bar.update(1)
        if progress is not None:
            progress(stage, done, len(futures))
    bar.close()
    return [future.result() for future in futures]


def _scan(dask: Client, files: list[Any], config: ReshardConfig,
          progress: Progress | None) -> list[FileScan]:
    futures = dask.map(scan_file, files, spec=config.dataset, seed=config.seed,
                       holdout_fraction=config.holdout_fraction,
                       max_piece_rows=config.max_piece_rows, retry=config.retry, pure=False)
    scans = check_schemas(_progress(futures, "scan", progress))
    unreadable = [scan for scan in scans if scan.transient]
    if unreadable:
        raise InputsUnreadable(
            f"{len(unreadable)} input files could not be read, for reasons that may pass; "
            "nothing is committed, rerun once the store answers: "
            + redact("; ".join(f"{scan.file.uri}: {scan.reason}" for scan in unreadable)))
    rejected = [scan for scan in scans if scan.reason is not None]
    if len(rejected) > config.max_rejected_fraction * len(scans):
        details = redact("; ".join(f"{scan.file.uri}: {scan.reason}" for scan in rejected))
        raise TooManyRejected(
            f"{len(rejected)} of {len(scans)} input files rejected, more than "
            f"max_rejected_fraction={config.max_rejected_fraction} allows: {details}"
        )
    check_classes(scans, config.dataset)
    groups = overlapping_id_groups(scans)
    found = dask.gather(dask.map(retrying(duplicate_ids, config.retry), groups,
                                 id_column=config.dataset.id_column, pure=False)) if groups else []
    if any(found):
        raise InputError("; ".join(problem for problem in found if problem))
    return scans


def _output_schema(scans: list[FileScan], config: ReshardConfig) -> pa.Schema:
    schema = next(scan.schema for scan in scans if scan.reason is None and scan.schema)
    schema = schema.remove_metadata()
    if config.dataset.source_column is None:
        if DERIVED_SOURCE_COLUMN in schema.names:
            raise ValueError(f"dataset.source_column is None but inputs already have a "
                             f"'{DERIVED_SOURCE_COLUMN}' column; name it as source_column")
        schema = schema.append(pa.field(DERIVED_SOURCE_COLUMN, pa.string()))
    return schema


def _plan(scans: list[FileScan],
          config: ReshardConfig) -> tuple[dict[str, SplitPlan], list[tuple[int, int]]]:
    records, pieces = count_records(scans)
    shard_rows = shard_rows_target(scans, config)
    plans = {
        "train": plan_split(records, "train", config.mix, config.num_output_rows, shard_rows,
                            config.shuffle, config.seed),
        "holdout": plan_split(records, "holdout", None, None, shard_rows, config.shuffle,
                              config.seed),
    }
    if plans["train"].num_output_rows == 0:
        raise ValueError("no training rows: every accepted input row was held out or rejected")
    return {name: plan for name, plan in plans.items() if plan.num_output_rows}, pieces


def shard_rows_target(scans: list[FileScan], config: ReshardConfig) -> int:
    """Rows per shard: configured directly, or from a byte target and the inputs' row size."""
    if config.target_shard_bytes is None:
        return config.target_shard_rows
    accepted = [scan for scan in scans if scan.reason is None]
    num_bytes = sum(scan.file.num_bytes for scan in accepted)
    num_rows = sum(sum(scan.piece_rows) for scan in accepted)
    return max(1, int(config.target_shard_bytes * num_rows / max(num_bytes, 1)))


def _piece_tasks(scans: list[FileScan], plans: dict[str, SplitPlan],
                 pieces: list[tuple[int, int]], staging: str) -> list[PieceTask]:
    tasks = []
    for piece, (scan_index, index_in_file) in enumerate(pieces):
        scan = scans[scan_index]
        first_row = int(np.sum(scan.piece_rows[:index_in_file]))
        offsets = {name: plan.piece_offsets.get(piece, {}) for name, plan in plans.items()}
        tasks.append(PieceTask(piece, scan.file, first_row, scan.piece_rows[index_in_file],
                               offsets, staging))
    return tasks


def _exchange(dask: Client, scans: list[FileScan], plans: dict[str, SplitPlan],
              pieces: list[tuple[int, int]], config: ReshardConfig, attempt: VersionAttempt,
              progress: Progress | None) -> list[Bucket]:
    # Map tasks need the layout, not every piece's offsets: ship that once per worker.
    slim = {name: _without_offsets(plan) for name, plan in plans.items()}
    shared = dask.scatter(slim, broadcast=True)
    tasks = _piece_tasks(scans, plans, pieces, attempt.uri)
    futures = dask.map(retrying(map_piece, config.retry), tasks, plans=shared,
                       spec=config.dataset, seed=config.seed,
                       holdout_fraction=config.holdout_fraction, pure=False)
    return [bucket for result in _progress(futures, "exchange", progress) for bucket in result]


def _without_offsets(plan: SplitPlan) -> SplitPlan:
    return replace(plan, piece_offsets={})


def _reduce(dask: Client, plans: dict[str, SplitPlan], buckets: list[Bucket], schema: pa.Schema,
            config: ReshardConfig, attempt: VersionAttempt,
            progress: Progress | None) -> dict[str, SplitEntry]:
    by_shard: dict[tuple[str, int], list[Bucket]] = {}
    for bucket in buckets:
        by_shard.setdefault((bucket.split, bucket.shard), []).append(bucket)
    futures, names = [], []
    for split, plan in plans.items():
        for shard, rows in enumerate(plan.shard_rows()):
            uri = attempt.shard_uri(shard_name(split, shard))
            futures.append(dask.submit(
                retrying(reduce_shard, config.retry), by_shard.get((split, shard), []),
                int(rows), uri, schema,
                config.dataset, config.rows_per_row_group, pure=False))
            names.append(split)
    entries = _progress(futures, "write", progress)
    return {split: _split_entry([e for e, n in zip(entries, names, strict=True) if n == split])
            for split in plans}


def _split_entry(entries: list[ShardEntry]) -> SplitEntry:
    return SplitEntry(num_rows=sum(entry.num_rows for entry in entries), shards=entries)


def _input_histograms(scans: list[FileScan]) -> tuple[dict[str, int], dict[str, int]]:
    classes: dict[str, int] = {}
    sources: dict[str, int] = {}
    for scan in scans:
        for _, _, label, source, n in scan.counts if scan.reason is None else []:
            classes[str(label)] = classes.get(str(label), 0) + n
            sources[str(source)] = sources.get(str(source), 0) + n
    return classes, sources


def _manifest(config: ReshardConfig, version_id: str, fingerprint: str, scans: list[FileScan],
              schema: pa.Schema, plans: dict[str, SplitPlan], splits: dict[str, SplitEntry],
              timings: dict[str, float], features: dict[str, Any]) -> Manifest:
    input_classes, input_sources = _input_histograms(scans)
    train = plans["train"]
    # Every class of any split: a class whose rows were all held out is still one the
    # holdout's labels must map to.
    labels = {label for plan in plans.values() for label, _ in plan.strata}
    return Manifest(
        version_id=version_id,
        label_column=config.dataset.label_column,
        source_column=config.dataset.source_column or DERIVED_SOURCE_COLUMN,
        id_column=config.dataset.id_column,
        feature_columns=list(config.dataset.feature_columns),
        classes=sorted(labels, key=_json_sort_key),
        sources=sorted({source for _, source in train.strata}, key=_json_sort_key),
        arrow_schema=[{"name": f.name, "type": str(f.type)} for f in schema],
        splits=splits, seed=config.seed, config=redact_value(config.model_dump(mode="json")),
        input_fingerprint=fingerprint, input_class_counts=input_classes,
        input_source_counts=input_sources,
        rejected=[RejectedFile(redact(s.file.uri), redact(s.reason)) for s in scans
                  if s.reason is not None],
        features=features,
        timings_s=timings, code_version=code_version(),
    )


def _json_sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))
