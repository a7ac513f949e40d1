"""The exchange and write stages of a reshard on Dask: map and merge rounds into the
attempt's staging, then the write tasks that make the shards, each stage running only
the tasks a killed attempt of the version did not finish (preprocessing/driver/resume.py);
or, on the single-pass route (preprocessing/plan/route.py, chosen here by `route_of`),
the one task that reads, routes and writes it all (preprocessing/exchange/single_pass.py).
`preprocessing/driver/reshard.py` runs them between its plan and its commit."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

import numpy as np
import pyarrow as pa
from distributed import Client

from preprocessing.config import ReshardConfig
from preprocessing.contract.manifest import ShardEntry, SplitEntry
from preprocessing.driver.cluster import DaskConfig
from preprocessing.driver.resume import EXCHANGE_PREFIX, Rerun, layout_digest, plan_rerun
from preprocessing.driver.waves import Progress, StageProgress, run_in_waves, share
from preprocessing.exchange.single_pass import SinglePass, single_pass
from preprocessing.exchange.staged_rows import Destinations, content_tally
from preprocessing.exchange.tasks import (
    Staging,
    decoded_input,
    destinations_for,
    exchange_layout,
    map_pieces,
    map_task,
    merge_task,
    piece_group,
    piece_rows,
    release_encode_buffers,
    shard_jobs,
    write_shards,
)
from preprocessing.plan.key_tally import KeyCounts, merge_keys
from preprocessing.plan.route import SINGLE_PASS, Route, plan_route, runs_in_process
from preprocessing.plan.split import SplitPlan
from preprocessing.plan.split_keys import content_in_map
from preprocessing.scan.across_files import drop_lists, time_cut_of
from preprocessing.scan.content_pairs import pairs_dir
from preprocessing.scan.inputs import FileScan
from preprocessing.storage.sources import InputFile
from preprocessing.toolbox.faults import retrying
from preprocessing.versions.attempt import VersionAttempt

log = logging.getLogger(__name__)
# The single pass's budget when `single_pass_bytes` is unset: this share of the host's
# memory, not Dask's automatic worker limit (about the host's memory over the workers),
# so a loaded host keeps room for what else runs (docs/data-path.md, step 4).
HOST_MEMORY_SHARE = 8


@dataclass(frozen=True)
class Cluster:
    """A run's Dask client with its worker threads and task limit, counted once."""

    dask: Client
    threads: int
    in_flight: int  # tasks submitted and not yet done, at most

    @classmethod
    def of(cls, dask: Client, config: ReshardConfig) -> Cluster:
        threads = max(1, sum(dask.nthreads().values()))
        return cls(dask, threads, config.max_tasks_in_flight or max(8, 4 * threads))


def default_executor(config: ReshardConfig, files: list[InputFile]) -> DaskConfig:
    """Threads in this process for inputs of seconds (plan/route.py `runs_in_process`),
    else a local cluster of `config.num_workers` worker processes."""
    stored, budget = sum(file.num_bytes for file in files), single_pass_budget(config)
    small = runs_in_process(stored, budget, len(files))
    kind: Literal["threads", "local"] = "threads" if small else "local"
    log.info(
        "workers: %s (%d inputs, %.1f MiB as stored, single_pass_bytes %.1f MiB)",
        "threads in this process" if small else f"{config.num_workers} local processes",
        len(files),
        stored / 2**20,
        budget / 2**20,
    )
    return DaskConfig(kind=kind, num_workers=config.num_workers)


def single_pass_budget(config: ReshardConfig) -> int:
    """`single_pass_bytes`, or when unset HOST_MEMORY_SHARE of the host's memory."""
    if config.single_pass_bytes is not None:
        return config.single_pass_bytes
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // HOST_MEMORY_SHARE


def make_shards(
    dask: Cluster,
    scans: list[FileScan],
    plans: dict[str, SplitPlan],
    pieces: np.ndarray,
    schema: pa.Schema,
    config: ReshardConfig,
    attempt: VersionAttempt,
    progress: Progress | None,
    timings: dict[str, float],
) -> tuple[dict[str, SplitEntry], Route, dict[str, int], KeyCounts]:
    """Every shard of the plans, into `attempt`, by the route `route_of` chooses: the
    splits' entries, the route, what was kept of a dead attempt (`Rerun.resumed`), and
    the rows' content tally where the exchange takes it (split_keys.content_in_map)."""
    route = route_of(scans, plans, config)
    stages = (dask, scans, plans, pieces, schema, config, attempt, progress)
    if route.name == SINGLE_PASS:
        splits, keys = timed(timings, "write_s", lambda: single_pass_stage(*stages))
        return splits, route, {}, keys
    staging, rerun, keys = timed(timings, "exchange_s", lambda: exchange(*stages))
    splits = timed(
        timings,
        "write_s",
        lambda: write_stage(dask, plans, staging, rerun, schema, config, attempt, progress),
    )
    attempt.discard(staging.round_uri(len(staging.layout.rounds) - 1))  # all written
    return splits, route, rerun.resumed, keys


def _destinations(
    plans: dict[str, SplitPlan],
    schema: pa.Schema,
    scans: list[FileScan],
    config: ReshardConfig,
    attempt: VersionAttempt,
) -> Destinations:
    """What every route's tasks share, with the night's time cut and drop lists."""
    cut = time_cut_of(scans, config.dataset, config.holdout_fraction)
    return destinations_for(plans, schema, cut, drop_lists(scans, pairs_dir(attempt.uri)))


def timed(timings: dict[str, float], name: str, step: Callable[[], Any]) -> Any:
    """`step()`, its seconds kept in `timings` under `name`."""
    start = time.perf_counter()
    result = step()
    timings[name] = round(time.perf_counter() - start, 3)
    return result


def exchange(
    dask: Cluster,
    scans: list[FileScan],
    plans: dict[str, SplitPlan],
    pieces: np.ndarray,
    schema: pa.Schema,
    config: ReshardConfig,
    attempt: VersionAttempt,
    progress: Progress | None,
) -> tuple[Staging, Rerun, KeyCounts]:
    """The map round and any merge rounds, in `attempt`'s staging, and the map tasks'
    content tally merged (exchange/tasks.py `map_pieces`); tasks get piece lists or two
    integers, and the driver keeps nothing per staged object but, where the exchange takes
    it, its tally (at most SAMPLE + TOP keys a split). A round's objects are discarded
    once the next round has read them: the disk (and page cache) holds two rounds at a
    time, not every round till the end. Only the tasks whose outputs a dead attempt of the
    version did not leave intact run (driver/resume.py); under `content_in_map` the
    others' tallies are taken again (exchange/staged_rows.py `content_tally`)."""
    destinations = _destinations(plans, schema, scans, config, attempt)
    layout = exchange_layout(scans, plans, pieces, config, dask.threads)
    staging = Staging(
        f"{attempt.uri}/{EXCHANGE_PREFIX}{layout_digest(layout)}",
        layout,
        destinations.schema,
        config.upload_part_bytes,
        receipts=attempt.resumable,
    )
    shard_uris = [uri for _, uri in shard_jobs(plans, attempt.shard_uri)]
    rerun = plan_rerun(dask.dask, dask.in_flight, attempt, staging, shard_uris)
    counter = StageProgress(
        "exchange", sum(map(len, rerun.rounds)), progress, *config.stall_deadline
    )
    # Map tasks need the plans' layout, not every piece's offsets: that goes to the cluster
    # once, as a task's result a dead worker's successor can recompute (waves.share).
    first_rows = piece_rows(scans, pieces)[0]
    tasks = (
        (map_task(scans, plans, pieces, first_rows, staging, task),) for task in rerun.rounds[0]
    )
    shared_settings: dict[str, Any] = {
        "destinations": share(dask.dask, destinations),
        "spec": config.dataset,
        "seed": config.seed,
        "holdout_fraction": config.holdout_fraction,
    }
    mapped = run_in_waves(
        dask.dask,
        retrying(map_pieces, config.retry),
        tasks,
        len(rerun.rounds[0]),
        dask.in_flight,
        counter,
        **shared_settings,
    )
    keys = [tally for _, tally in mapped]
    if content_in_map(config.dataset):  # the tallies of the map tasks a rerun kept
        kept = sorted(set(range(layout.num_map_tasks)) - set(rerun.rounds[0]))
        again = ((map_task(scans, plans, pieces, first_rows, staging, t).pieces,) for t in kept)
        tally = retrying(content_tally, config.retry)
        keys += run_in_waves(dask.dask, tally, again, len(kept), dask.in_flight, **shared_settings)
    shared = share(dask.dask, staging)
    for index in range(1, len(layout.rounds)):
        run_in_waves(
            dask.dask,
            retrying(merge_task, config.retry),
            ((index, task) for task in rerun.rounds[index]),
            len(rerun.rounds[index]),
            dask.in_flight,
            counter,
            staging=shared,
        )
        attempt.discard(staging.round_uri(index - 1))
    counter.close()
    return staging, rerun, merge_keys(keys)


def write_stage(
    dask: Cluster,
    plans: dict[str, SplitPlan],
    staging: Staging,
    rerun: Rerun,
    schema: pa.Schema,
    config: ReshardConfig,
    attempt: VersionAttempt,
    progress: Progress | None,
) -> dict[str, SplitEntry]:
    """Write tasks over runs of consecutive shards, each reading one range of each of the
    last round's objects that cover them; those of shards a dead attempt left intact are
    kept (driver/resume.py)."""
    shards = shard_jobs(plans, attempt.shard_uri)
    bounds = staging.layout.write_bounds.tolist()
    tasks = [(bounds[task], shards[bounds[task] : bounds[task + 1]]) for task in rerun.writes]
    counter = StageProgress("write", len(tasks), progress, *config.stall_deadline)
    try:
        entries = run_in_waves(
            dask.dask,
            retrying(write_shards, config.retry),
            tasks,
            len(tasks),
            dask.in_flight,
            counter,
            staging=share(dask.dask, staging),
            schema=share(dask.dask, schema),
            spec=config.dataset,
            rows_per_row_group=config.rows_per_row_group,
            receipts=attempt.uri if attempt.resumable else None,
        )
    finally:
        _release_encode_buffers(dask.dask)
    counter.close()
    written = {first: group for (first, _), group in zip(tasks, entries, strict=True)}
    found = dict(rerun.shards)
    for first, group in written.items():
        found.update(enumerate(group, start=first))
    return split_entries(plans, [found[destination] for destination in range(len(shards))])


def route_of(scans: list[FileScan], plans: dict[str, SplitPlan], config: ReshardConfig) -> Route:
    """The route of this reshard (plan/route.py), logged on one line."""
    accepted = sum(scan.reason is None for scan in scans)
    route = plan_route(*decoded_input(scans, plans), single_pass_budget(config), accepted)
    log.info("%s", route.line())
    return route


def single_pass_stage(
    dask: Cluster,
    scans: list[FileScan],
    plans: dict[str, SplitPlan],
    pieces: np.ndarray,
    schema: pa.Schema,
    config: ReshardConfig,
    attempt: VersionAttempt,
    progress: Progress | None,
) -> tuple[dict[str, SplitEntry], KeyCounts]:
    """Every shard in one task that reads every input once and stages nothing
    (exchange/single_pass.py), into `attempt` like the write stage's shards; with the
    rows' content tally where the exchange takes it."""
    # The map tasks' groups: the pass routes a group at a time (exchange/single_pass.py).
    bounds = exchange_layout(scans, plans, pieces, config, dask.threads).map_bounds.tolist()
    first_rows = piece_rows(scans, pieces)[0]
    groups = [piece_group(scans, plans, pieces, first_rows, a, b) for a, b in pairwise(bounds)]
    task = SinglePass(groups, shard_jobs(plans, attempt.shard_uri))
    counter = StageProgress("write", 1, progress, *config.stall_deadline)
    [(entries, keys)] = run_in_waves(
        dask.dask,
        retrying(single_pass, config.retry),
        [(task,)],
        1,
        1,
        counter,
        destinations=_destinations(plans, schema, scans, config, attempt),
        schema=schema,
        spec=config.dataset,
        seed=config.seed,
        holdout_fraction=config.holdout_fraction,
        rows_per_row_group=config.rows_per_row_group,
        part_bytes=config.upload_part_bytes,
        threads=dask.threads,
        block_bytes=config.exchange_task_bytes,
    )
    counter.close()
    return split_entries(plans, entries), keys


def split_entries(plans: dict[str, SplitPlan], entries: list[ShardEntry]) -> dict[str, SplitEntry]:
    """Every split's entry from its shards' (`entries`: every shard, in destination order)."""
    flat = iter(entries)
    return {
        split: _split_entry([next(flat) for _ in range(plan.num_shards)])
        for split, plan in plans.items()
    }


def _release_encode_buffers(dask: Client) -> None:
    """Let the workers' kept encode buffers go (exchange/tasks.py: a shard's size each).
    Best effort: a cluster that lost its workers or scheduler holds none to let go."""
    with contextlib.suppress(OSError, TimeoutError):
        dask.run(release_encode_buffers, on_error="ignore")


def _split_entry(entries: list[ShardEntry]) -> SplitEntry:
    return SplitEntry(num_rows=sum(entry.num_rows for entry in entries), shards=entries)
