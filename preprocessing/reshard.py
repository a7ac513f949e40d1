"""The reshard driver: scan, plan, exchange and commit one dataset version, on Dask.

`run_reshard(config)` is the whole stage; Dask only executes the pure steps of
`scan`, `plan`, `resample` and `exchange`. The version id hashes the input
listing, the config (minus settings that cannot change the output) and the code
version, so re-running on unchanged inputs finds the committed manifest and
does no work. Shards are written into the version directory, the manifest last,
then `_CURRENT` is swapped: a run killed at any point leaves no visible version.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from itertools import pairwise
from typing import Any

import dask
import numpy as np
import pyarrow as pa
from distributed import Client, LocalCluster
from fsspec.core import url_to_fs

from preprocessing.config import ReshardConfig
from preprocessing.exchange import (
    DERIVED_SOURCE_COLUMN,
    Staging,
    destinations_for,
    exchange_layout,
    map_pieces,
    map_task,
    merge_task,
    piece_rows,
    shard_jobs,
    write_shards,
)
from preprocessing.manifest import (
    FORMAT_VERSION,
    Manifest,
    ManifestError,
    RejectedFile,
    ShardEntry,
    SplitEntry,
    read_current_version,
    read_manifest,
    staging_dir,
    swap_current,
    version_dir,
    write_manifest,
)
from preprocessing.plan import SplitPlan, plan_split
from preprocessing.rounds import group_pieces
from preprocessing.scan import (
    FileScan,
    check_schemas,
    count_records,
    fingerprint_inputs,
    list_inputs,
    scan_file,
)
from preprocessing.waves import Progress, StageProgress, run_in_waves

# Settings that change how fast or where a version is made, never what is in it.
_OUTPUT_NEUTRAL_FIELDS = {"num_workers", "output_root", "exchange_task_bytes", "exchange_fan_in",
                          "exchange_rounds", "max_tasks_in_flight"}


class TooManyRejected(RuntimeError):
    """More input files were bad than `max_rejected_fraction` allows."""


@dataclass(frozen=True)
class ReshardResult:
    """The committed version, where its manifest is, and whether this run made it."""

    manifest: Manifest
    manifest_uri: str
    reused: bool


def code_version() -> str:
    try:
        return f"ballast-{version('ballast')}-format{FORMAT_VERSION}"
    except PackageNotFoundError:
        return f"ballast-dev-format{FORMAT_VERSION}"


def compute_version_id(fingerprint: str, config: ReshardConfig) -> str:
    """Hash of inputs + output-relevant config + code version (16 hex digits)."""
    settings = config.model_dump(mode="json", exclude=_OUTPUT_NEUTRAL_FIELDS)
    payload = json.dumps([fingerprint, settings, code_version()], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@contextmanager
def dask_client(client: Client | None, num_workers: int) -> Iterator[Client]:
    """Use the caller's client, or a local cluster of worker processes for this run."""
    if client is not None:
        yield client
        return
    with local_cluster(num_workers) as cluster, Client(cluster) as local:
        yield local


# Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=64 KiB, which also turns off
# glibc's adaptive mmap threshold: every numpy or Python buffer over 128 KiB is then mapped
# fresh and unmapped on free, so each temporary of the exchange page-faults anew (2.0 M
# faults and ~40% of the reshard's CPU time in the kernel, measured on 1 GB). Arrays up to
# 64 MiB come from the heap instead; up to 256 MiB of free heap is kept for reuse.
WORKER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": 64 << 20, "MALLOC_TRIM_THRESHOLD_": 256 << 20}


def local_cluster(num_workers: int, **options: Any) -> LocalCluster:
    """A LocalCluster of single-threaded worker processes with the allocator settings above."""
    environ = {f"distributed.nanny.pre-spawn-environ.{name}": value
               for name, value in WORKER_MALLOC_ENV.items()}
    with dask.config.set(environ):
        return LocalCluster(n_workers=num_workers, threads_per_worker=1, processes=True,
                            dashboard_address=":0", **options)


def version_id_for(config: ReshardConfig) -> str:
    """The id the version of `config` has or will have: lists the inputs, reads no data."""
    return compute_version_id(fingerprint_inputs(list_inputs(config.dataset)), config)


def version_is_committed(output_root: str, version_id: str) -> bool:
    """Whether version `version_id` is committed under `output_root` already."""
    return _committed(output_root, version_id) is not None


def run_reshard(config: ReshardConfig, client: Client | None = None,
                progress: Progress | None = None) -> ReshardResult:
    """Make (or find) the dataset version for `config` and commit it.

    `progress(stage, done, total)` is called as tasks finish (an orchestrator shows it).
    """
    files = list_inputs(config.dataset)
    fingerprint = fingerprint_inputs(files)
    version_id = compute_version_id(fingerprint, config)
    existing = _committed(config.output_root, version_id)
    if existing is not None:
        return ReshardResult(*existing, reused=True)
    previous = read_current_version(config.output_root)
    timings: dict[str, float] = {}
    with dask_client(client, config.num_workers) as dask:
        scans = _timed(timings, "scan_s", lambda: _scan(dask, files, config, progress))
        schema = _output_schema(scans, config)
        plans, pieces = _timed(timings, "plan_s", lambda: _plan(scans, config))
        staging = _timed(timings, "exchange_s", lambda: _exchange(
            dask, scans, plans, pieces, schema, config,
            staging_dir(config.output_root, version_id), progress))
        splits = _timed(timings, "write_s", lambda: _reduce(
            dask, plans, staging, schema, config, version_dir(config.output_root, version_id),
            progress))
    manifest = _manifest(config, version_id, fingerprint, scans, schema, plans, splits, timings)
    location = write_manifest(config.output_root, manifest)
    swap_current(config.output_root, version_id, expected=previous)
    _remove_staging(config.output_root, version_id)
    return ReshardResult(manifest, location, reused=False)


def _committed(root: str, version_id: str) -> tuple[Manifest, str] | None:
    try:
        return read_manifest(version_dir(root, version_id))
    except ManifestError:
        return None


def _timed(timings: dict[str, float], name: str, step: Any) -> Any:
    start = time.perf_counter()
    result = step()
    timings[name] = round(time.perf_counter() - start, 3)
    return result


def _scan(dask: Client, files: list[Any], config: ReshardConfig,
          progress: Progress | None) -> list[FileScan]:
    # Files in groups of about a task's bytes: a Dask task costs more than scanning a small
    # file (5,000 files of 58 KB: 47 s one task each, on two workers).
    threads = max(1, sum(dask.nthreads().values()))
    bounds = group_pieces(np.array([f.num_bytes for f in files]), config.exchange_task_bytes,
                          4 * threads).tolist()
    counter = StageProgress("scan", len(bounds) - 1, progress)
    groups = run_in_waves(dask, _scan_files, ((files[a:b],) for a, b in pairwise(bounds)),
                          len(bounds) - 1, _in_flight(config, threads), counter,
                          spec=config.dataset, seed=config.seed,
                          holdout_fraction=config.holdout_fraction,
                          max_piece_rows=config.max_piece_rows)
    counter.close()
    scans = check_schemas([scan for group in groups for scan in group])
    rejected = [scan for scan in scans if scan.reason is not None]
    if len(rejected) > config.max_rejected_fraction * len(scans):
        details = "; ".join(f"{scan.file.uri}: {scan.reason}" for scan in rejected)
        raise TooManyRejected(
            f"{len(rejected)} of {len(scans)} input files rejected, more than "
            f"max_rejected_fraction={config.max_rejected_fraction} allows: {details}"
        )
    return scans


def _in_flight(config: ReshardConfig, threads: int) -> int:
    return config.max_tasks_in_flight or max(8, 4 * threads)


def _scan_files(files: list[Any], **settings: Any) -> list[FileScan]:
    return [scan_file(file, **settings) for file in files]


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


def _exchange(dask: Client, scans: list[FileScan], plans: dict[str, SplitPlan],
              pieces: list[tuple[int, int]], schema: pa.Schema, config: ReshardConfig,
              staging_uri: str, progress: Progress | None) -> Staging:
    """The map round and any merge rounds; tasks get piece lists or two integers, and the
    driver keeps nothing per staged object."""
    destinations = destinations_for(plans, schema)
    threads = max(1, sum(dask.nthreads().values()))
    layout = exchange_layout(scans, plans, pieces, config, threads)
    staging = Staging(staging_uri, layout, destinations.schema)
    limit = _in_flight(config, threads)
    counter = StageProgress("exchange", sum(r.num_objects for r in layout.rounds), progress)
    # Map tasks need the plans' layout, not every piece's offsets: that goes once per worker.
    first_rows = piece_rows(scans, pieces)[0]
    tasks = ((map_task(scans, plans, pieces, first_rows, staging, task),)
             for task in range(layout.num_map_tasks))
    run_in_waves(dask, map_pieces, tasks, layout.num_map_tasks, limit, counter,
                 destinations=dask.scatter(destinations, broadcast=True, hash=False),
                 spec=config.dataset, seed=config.seed, holdout_fraction=config.holdout_fraction)
    shared = dask.scatter(staging, broadcast=True, hash=False)
    for index in range(1, len(layout.rounds)):
        run_in_waves(dask, merge_task, ((index, task) for task in range(
            layout.rounds[index].num_objects)), layout.rounds[index].num_objects, limit,
            counter, staging=shared)
    counter.close()
    return staging


def _reduce(dask: Client, plans: dict[str, SplitPlan], staging: Staging, schema: pa.Schema,
            config: ReshardConfig, root: str, progress: Progress | None) -> dict[str, SplitEntry]:
    """Write tasks over runs of consecutive shards, each reading one range of each of the
    last round's objects that cover them."""
    shards = shard_jobs(plans, root)
    bounds = staging.layout.write_bounds.tolist()
    tasks = [(first, shards[first:stop]) for first, stop in pairwise(bounds)]
    threads = max(1, sum(dask.nthreads().values()))
    counter = StageProgress("write", len(tasks), progress)
    entries = run_in_waves(dask, write_shards, tasks, len(tasks), _in_flight(config, threads),
                           counter,
                           staging=dask.scatter(staging, broadcast=True, hash=False),
                           schema=dask.scatter(schema, broadcast=True, hash=False),
                           spec=config.dataset, rows_per_row_group=config.rows_per_row_group)
    counter.close()
    flat = iter([entry for group in entries for entry in group])
    return {split: _split_entry([next(flat) for _ in range(plan.num_shards)])
            for split, plan in plans.items()}


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
              timings: dict[str, float]) -> Manifest:
    input_classes, input_sources = _input_histograms(scans)
    train = plans["train"]
    return Manifest(
        version_id=version_id,
        label_column=config.dataset.label_column,
        source_column=config.dataset.source_column or DERIVED_SOURCE_COLUMN,
        id_column=config.dataset.id_column,
        feature_columns=list(config.dataset.feature_columns),
        classes=sorted({label for label, _ in train.strata}, key=_json_sort_key),
        sources=sorted({source for _, source in train.strata}, key=_json_sort_key),
        arrow_schema=[{"name": f.name, "type": str(f.type)} for f in schema],
        splits=splits, seed=config.seed, config=config.model_dump(mode="json"),
        input_fingerprint=fingerprint, input_class_counts=input_classes,
        input_source_counts=input_sources,
        rejected=[RejectedFile(s.file.uri, s.reason) for s in scans if s.reason is not None],
        timings_s=timings, code_version=code_version(),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _json_sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))


def _remove_staging(root: str, version_id: str) -> None:
    fs, path = url_to_fs(staging_dir(root, version_id))
    if fs.exists(path):
        fs.rm(path, recursive=True)
