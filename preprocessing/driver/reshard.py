"""The reshard driver: scan, plan, exchange and commit one dataset version, on Dask.

`run_reshard(config)` is the whole stage; Dask only executes the pure steps of
`scan`, `plan`, `resample` and `exchange`. The version id hashes the input
listing, the config (minus settings that cannot change the output) and the code
version (and a chain's child its parent's id: preprocessing/versions/incremental.py decides
whether a run appends), so re-running on unchanged inputs finds the committed
manifest and does no work. The inputs are listed once per run (`list_once`: at a
petabyte a listing takes minutes and many requests); a caller that needs the version id
before the run (an orchestrator's cache key) lists them and hands the `Listing` over.
Each run stages in its own attempt directory (`preprocessing/versions/attempt.py`) and
commits through `commit_version` (shards, the manifest last, then `_CURRENT`): a run
killed at any point leaves no visible version, and the rerun finishes whatever step it
died after.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa

from preprocessing.config import ReshardConfig
from preprocessing.contract.commit import commit_version
from preprocessing.contract.manifest import (
    Manifest,
    ManifestError,
    read_current_version,
    read_manifest,
    version_dir,
)
from preprocessing.driver.cluster import Executor, dask_client
from preprocessing.driver.resume import resumed_line
from preprocessing.driver.stages import Cluster, default_executor, make_shards, timed
from preprocessing.driver.waves import Progress, StageProgress, run_in_waves
from preprocessing.exchange.staged_rows import DERIVED_SOURCE_COLUMN
from preprocessing.plan.first_copies import PAIR_DTYPE
from preprocessing.plan.layout import group_pieces
from preprocessing.plan.row_ids import DERIVED_ID_COLUMN
from preprocessing.plan.split import SplitPlan, plan_split
from preprocessing.scan.across_files import (
    check_classes,
    check_ids,
    check_schemas,
    count_records,
    feature_state,
    rows_written,
    with_first_copies,
    with_time_cut,
)
from preprocessing.scan.columns import absent_columns_error
from preprocessing.scan.content_pairs import pairs_dir
from preprocessing.scan.inputs import FileScan, scan_file
from preprocessing.scan.scan_record import load_scans, store_scans
from preprocessing.storage.reach import check_reachable
from preprocessing.storage.sources import InputFile, fingerprint_inputs, list_inputs
from preprocessing.toolbox.faults import PermanentError, RetriesExhausted, retrying
from preprocessing.toolbox.secrets import redact
from preprocessing.versions.attempt import VersionAttempt, collect_expired
from preprocessing.versions.chain_commit import commit_following
from preprocessing.versions.incremental import (
    Increment,
    check_schema,
    earlier_scans,
    plan_increment,
    version_id_of,
)
from preprocessing.versions.version_manifest import version_manifest

PAIR_BYTES = PAIR_DTYPE.itemsize


class TooManyRejected(PermanentError, RuntimeError):
    """More input files were bad than `max_rejected_fraction` allows."""


class InputsUnreadable(RetriesExhausted, RuntimeError):
    """Input files still unreadable after every try, for reasons that may pass: no version
    is committed without them (a rerun reads them again; no outer level retries it)."""


@dataclass(frozen=True)
class ReshardResult:
    """The committed version, where its manifest is, whether this run made it, and how
    it relates to the version that was current (`how`: full, appended, reused, and why)."""

    manifest: Manifest
    manifest_uri: str
    reused: bool
    how: str = ""

    @property
    def resumed(self) -> str:
        """What this run kept of a killed attempt of its version, in words ("" if none)."""
        return resumed_line(self.manifest.resumed) if not self.reused else ""


@dataclass(frozen=True)
class Listing:
    """The input files of a config as listed once, and their fingerprint (what the version
    id hashes of the inputs)."""

    files: list[InputFile]
    fingerprint: str


def list_once(config: ReshardConfig) -> Listing:
    """List the inputs of `config` (each root's listing retried on transient errors), once
    every object store it names has answered a quick probe (preprocessing/storage/reach.py)."""
    check_reachable([config.output_root])
    files = list_inputs(config.dataset, config.retry)
    return Listing(files, fingerprint_inputs(files))


@dataclass(frozen=True)
class VersionPlan:
    """The version a run makes, planned once per run: its inputs as listed, the current
    version it follows, how it relates to it (flat or appended), and its id (what an
    orchestrator caches by, and what `run_reshard` makes)."""

    listing: Listing
    previous: str | None
    increment: Increment
    version_id: str


def plan_version(config: ReshardConfig, listing: Listing | None = None) -> VersionPlan:
    """The version of `config`: from `listing` (else lists the inputs) and the current
    manifest (in `incremental` mode); reads no data."""
    listing = listing or list_once(config)
    previous = read_current_version(config.output_root)
    increment = plan_increment(config, listing.files, previous)
    return VersionPlan(
        listing, previous, increment, version_id_of(listing.fingerprint, config, increment)
    )


def version_id_for(config: ReshardConfig, listing: Listing | None = None) -> str:
    """The id the version of `config` has or will have (`plan_version`'s)."""
    return plan_version(config, listing).version_id


def version_is_committed(output_root: str, version_id: str) -> bool:
    """Whether version `version_id` is committed under `output_root` already."""
    return _committed(output_root, version_id) is not None


def run_reshard(
    config: ReshardConfig,
    executor: Executor | None = None,
    progress: Progress | None = None,
    listing: Listing | None = None,
    plan: VersionPlan | None = None,
) -> ReshardResult:
    """Make (or find) the dataset version for `config` and commit it.

    `executor`: a Dask client, or the config of a cluster to start or join; by default a
    local cluster of `config.num_workers` processes. `progress(stage, done, total)` is
    called as tasks finish (an orchestrator shows it). A version found committed is
    reused, and a commit an earlier attempt left unfinished (`_CURRENT` behind, staging of
    a dead attempt) is finished first. In `mode: incremental` a run that can append reads
    only the files new since the current version (preprocessing/versions/incremental.py).
    `listing`: the inputs as the caller listed them (`list_once`); None lists them here.
    `plan`: the version as the caller planned it (`plan_version`, once per run: its id is
    what the caller cached by); None plans it here.
    """
    root = config.output_root
    plan = plan or plan_version(config, listing)
    listing, previous, increment, version_id = (
        plan.listing,
        plan.previous,
        plan.increment,
        plan.version_id,
    )
    existing = _committed(root, version_id)
    if existing is not None:
        collect_expired(root)
        commit = commit_following(
            root,
            existing,
            previous,
            lambda expected: commit_version(root, existing, expected=expected),
        )
        return ReshardResult(commit.manifest, commit.location, True, increment.reason)
    # A killed run of the version is resumed (docs/reliability.md), on S3 too.
    with VersionAttempt(root, version_id, resume_max_age_s=config.resume_max_age_s) as attempt:
        manifest = _make_version(config, listing, increment, attempt, executor, progress)
        commit = commit_following(
            root, manifest, previous, lambda expected: attempt.commit(manifest, expected=expected)
        )
    return ReshardResult(commit.manifest, commit.location, not commit.written, increment.reason)


def _make_version(
    config: ReshardConfig,
    listing: Listing,
    increment: Increment,
    attempt: VersionAttempt,
    executor: Executor | None,
    progress: Progress | None,
) -> Manifest:
    """Scan, plan, exchange and write the shards into `attempt` (of every input, or of the
    new files when appending); the version's manifest."""
    timings: dict[str, float] = {}
    parent = increment.parent if increment.kind == "append" else None
    files = increment.new_files if parent else listing.files
    earlier = earlier_scans(parent) if parent else []
    executor = executor or default_executor(config, files)
    with dask_client(executor, storage=[config.output_root]) as client:
        dask = Cluster.of(client, config)
        scans = timed(
            timings, "scan_s", lambda: _scan_once(dask, files, config, progress, earlier, attempt)
        )
        scans = with_time_cut(scans, config.dataset, config.holdout_fraction)
        if config.dataset.duplicates == "drop":  # the night's first copies, before the plan
            scratch, budget = pairs_dir(attempt.uri), config.exchange_task_bytes // PAIR_BYTES
            reduce = partial(with_first_copies, scans, config.dataset, scratch, budget)
            scans = timed(timings, "first_copies_s", reduce)
            on_kept = (scans, earlier, config.dataset, partial(_on_cluster, dask, config))
            written = rows_written(scans, scratch)  # ids checked on the rows it keeps
            timed(timings, "id_check_s", lambda: check_ids(*on_kept, written))
        features = feature_state(scans, config.dataset, parent.features if parent else None)
        schema = _output_schema(scans, config)
        if parent:
            check_schema(schema, parent)
        plans, pieces = timed(timings, "plan_s", lambda: _plan(scans, config))
        splits, route, resumed, keys = make_shards(
            dask, scans, plans, pieces, schema, config, attempt, progress, timings
        )
    manifest = version_manifest(
        config,
        attempt.version_id,
        listing.fingerprint,
        scans,
        schema,
        plans,
        splits,
        timings,
        features,
        parent,
        len(pieces),
        keys,
    )
    return replace(manifest, resumed=resumed, route=route.record())


def _committed(root: str, version_id: str) -> Manifest | None:
    try:
        return read_manifest(version_dir(root, version_id))[0]
    except ManifestError:
        return None


def _scan_once(
    dask: Cluster,
    files: list[InputFile],
    config: ReshardConfig,
    progress: Progress | None,
    earlier: list[FileScan],
    attempt: VersionAttempt,
) -> list[FileScan]:
    """The scans the dead attempt this run took over kept, else `_scan`'s, kept for a rerun
    (preprocessing/scan/scan_record.py): a rerun reads no input twice."""
    if attempt.resumed_from is not None:
        kept = load_scans(attempt.uri, attempt.version_id, files)
        if kept is not None:
            return kept
    scans = _scan(dask, files, config, progress, earlier, pairs_dir(attempt.uri))
    if attempt.resumable:
        store_scans(attempt.uri, attempt.version_id, scans)
    return scans


def _scan(
    dask: Cluster,
    files: list[InputFile],
    config: ReshardConfig,
    progress: Progress | None,
    earlier: list[FileScan],
    scratch: str,
) -> list[FileScan]:
    """Scan `files`; the checks across files also see the `earlier` files of a parent
    (preprocessing/versions/incremental.py), whose ids are read again only where ranges overlap.
    `scratch`: where the scans write what `duplicates: drop` reduces (scan/content_pairs.py)."""
    # Files in groups of about a task's bytes: a Dask task costs more than scanning a small
    # file (5,000 files of 58 KB: 47 s one task each, on two workers).
    bounds = group_pieces(
        np.array([f.num_bytes for f in files]), config.exchange_task_bytes, 4 * dask.threads
    ).tolist()
    counter = StageProgress("scan", len(bounds) - 1, progress, *config.stall_deadline)
    groups = run_in_waves(
        dask.dask,
        _scan_files,
        ((files[a:b],) for a, b in pairwise(bounds)),
        len(bounds) - 1,
        dask.in_flight,
        counter,
        spec=config.dataset,
        seed=config.seed,
        holdout_fraction=config.holdout_fraction,
        max_piece_rows=config.max_piece_rows,
        retry=config.retry,
        pairs_dir=scratch,
    )
    counter.close()
    scans = check_schemas([scan for group in groups for scan in group])
    # A column no file has is the config's mistake: one error naming the field.
    if error := absent_columns_error([s.schema for s in scans if s.schema], config.dataset):
        raise error
    unreadable = [scan for scan in scans if scan.transient]
    if unreadable:
        raise InputsUnreadable(
            f"{len(unreadable)} input files could not be read, for reasons that may pass; "
            "nothing is committed, rerun once the store answers: "
            + redact("; ".join(f"{scan.file.uri}: {scan.reason}" for scan in unreadable))
        )
    rejected = [scan for scan in scans if scan.reason is not None]
    if len(rejected) > config.max_rejected_fraction * len(scans):
        details = redact("; ".join(f"{scan.file.uri}: {scan.reason}" for scan in rejected))
        raise TooManyRejected(
            f"{len(rejected)} of {len(scans)} input files rejected, more than "
            f"max_rejected_fraction={config.max_rejected_fraction} allows: {details}"
        )
    check_classes([*scans, *earlier], config.dataset)
    if config.dataset.duplicates != "drop":  # else on the rows the drop keeps, once known
        check_ids(scans, earlier, config.dataset, partial(_on_cluster, dask, config))
    return scans


def _on_cluster(
    dask: Cluster, config: ReshardConfig, task: Callable[..., Any], items: list
) -> list:
    """`task` of each of `items`, one cluster task each, retried on transient errors."""
    return dask.dask.gather(dask.dask.map(retrying(task, config.retry), items, pure=False))


def _scan_files(files: list[Any], **settings: Any) -> list[FileScan]:
    return [scan_file(file, **settings) for file in files]


def _output_schema(scans: list[FileScan], config: ReshardConfig) -> pa.Schema:
    schema = next(scan.schema for scan in scans if scan.reason is None and scan.schema)
    schema = schema.remove_metadata()
    if config.dataset.source_column is None:
        if DERIVED_SOURCE_COLUMN in schema.names:
            raise ValueError(
                f"dataset.source_column is None but inputs already have a "
                f"'{DERIVED_SOURCE_COLUMN}' column; name it as source_column"
            )
        schema = schema.append(pa.field(DERIVED_SOURCE_COLUMN, pa.string()))
    if config.dataset.id_column is None:  # preprocessing/plan/row_ids.py
        schema = schema.append(pa.field(DERIVED_ID_COLUMN, pa.int64()))
    return schema


def _plan(scans: list[FileScan], config: ReshardConfig) -> tuple[dict[str, SplitPlan], np.ndarray]:
    """The plans of the splits with rows, and each piece's (scan index, piece in file)."""
    counts, pieces = count_records(scans)
    shard_rows = shard_rows_target(scans, config)
    plans = {
        "train": plan_split(
            counts,
            "train",
            config.mix,
            config.num_output_rows,
            shard_rows,
            config.shuffle,
            config.seed,
            len(pieces),
        ),
        **{  # kept as drawn: neither is resampled
            split: plan_split(
                counts, split, None, None, shard_rows, config.shuffle, config.seed, len(pieces)
            )
            for split in ("holdout", "validation")
        },
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
