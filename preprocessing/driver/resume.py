"""What a rerun keeps of the dead attempt it took over, and the tasks it still has to run.

A reshard killed mid-exchange or mid-write leaves, in its attempt's staging
(`preprocessing/versions/attempt.py`), the staged objects and shards its finished tasks
wrote, each with a receipt (`preprocessing/exchange/receipts.py`). Its rerun (same
version id, so same inputs, config and code) takes that attempt over and, working back
from the shards: keeps every shard a receipt vouches for and that hashes to it; needs the
write tasks with a shard missing, so the last round's objects those read; keeps each
needed object whose bytes hash to its receipt, needs the merge (or map) tasks of the rest,
so their inputs in the round before, and so on down to the map tasks. Each prefix is
listed once (the round's objects with their receipts, the shards, the shard receipts).
On S3 the listing verifies (each receipt recorded its object's ETag: no read back, no HEAD
per object); on local disk the hashing runs on the cluster, a task per object or write
receipt. A write receipt is read with one GET each. The staged objects
are named by the exchange's layout (`layout_digest`): a rerun on a cluster of another
shape, whose tasks cut the pieces otherwise, keeps none of them (its shards, named by
the plan alone, it still keeps). Kept or rewritten, every byte is the one a clean run
writes: tasks are pure functions of the plan.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from distributed import Client
from fsspec.core import url_to_fs

from preprocessing.contract.manifest import ShardEntry, shard_path, write_atomically
from preprocessing.driver.waves import run_in_waves, share
from preprocessing.exchange.receipts import (
    SHARD_RECEIPTS,
    kept_shards,
    listed_objects,
    listing,
    needs_read_back,
)
from preprocessing.exchange.staged_objects import StagedObject, ranges_intact
from preprocessing.exchange.tasks import Staging
from preprocessing.plan.layout import ExchangeLayout
from preprocessing.versions.attempt import (
    LEASE_NAME,
    VersionAttempt,
    lease_expired,
    read_lease,
    staging_root,
)

log = logging.getLogger(__name__)
EXCHANGE_PREFIX = "exchange-"
TOTALS_NAME = "_TOTALS.json"  # an attempt's map tasks and shards, for `ballast status`


@dataclass(frozen=True)
class Rerun:
    """The tasks to run per round (object ids; round 0: map tasks), the write tasks to run
    (indexes into the layout's write bounds), the shards kept (by destination), and the
    counts for the manifest's `resumed` (empty when nothing was taken over)."""

    rounds: list[list[int]]
    writes: list[int]
    shards: dict[int, ShardEntry]
    resumed: dict[str, int]


def layout_digest(layout: ExchangeLayout) -> str:
    """A short digest of which pieces and destinations every staged object holds."""
    digest = hashlib.sha256(f"{layout.num_destinations}/{layout.fan_in}".encode())
    for array in (layout.map_bounds, layout.write_bounds):
        digest.update(array.astype("<i8").tobytes())
    for round_ in layout.rounds:
        digest.update(
            f"/{round_.num_groups}/".encode() + round_.block_bounds.astype("<i8").tobytes()
        )
    return digest.hexdigest()[:16]


def plan_rerun(
    client: Client, in_flight: int, attempt: VersionAttempt, staging: Staging, shard_uris: list[str]
) -> Rerun:
    """What is left to run in `attempt` (everything when it took over no dead attempt);
    `shard_uris`: where each destination's shard is written, in destination order."""
    layout = staging.layout
    bounds = layout.write_bounds.tolist()
    if attempt.resumable:
        totals = {"map_outputs": layout.num_map_tasks, "shards": len(shard_uris)}
        fs, path = url_to_fs(f"{attempt.uri}/{TOTALS_NAME}")
        write_atomically(fs, path, json.dumps(totals).encode())
    if attempt.resumed_from is None:
        everything = [list(range(r.num_objects)) for r in layout.rounds]
        return Rerun(everything, list(range(len(bounds) - 1)), {}, {})
    _discard_other_layouts(attempt, staging)
    shards = _verified_shards(client, in_flight, attempt, shard_uris)
    writes = [
        task
        for task, (first, stop) in enumerate(pairwise(bounds))
        if any(destination not in shards for destination in range(first, stop))
    ]
    rounds = _objects_to_make(client, in_flight, staging, writes)
    rewritten = sum(bounds[task + 1] - bounds[task] for task in writes)
    resumed = {
        "map_outputs": layout.num_map_tasks,
        "map_outputs_kept": layout.num_map_tasks - len(rounds[0]) if writes else 0,
        "shards": len(shard_uris),
        "shards_kept": len(shard_uris) - rewritten,
    }
    log.info("%s", resumed_line(resumed))
    return Rerun(rounds, writes, shards, resumed)


def _objects_to_make(
    client: Client, in_flight: int, staging: Staging, writes: list[int]
) -> list[list[int]]:
    """Per round, the objects the `writes` need, directly or through a later round, that
    are not intact: the tasks to run."""
    layout = staging.layout
    firsts = layout.write_bounds.tolist()
    needed = {item for task in writes for item in layout.write_inputs(firsts[task])}
    # The last round's objects are read only for these destinations: only their bytes
    # are checked (an earlier round's objects are merged whole).
    destinations = {d for task in writes for d in range(firsts[task], firsts[task + 1])}
    rounds: list[list[int]] = []
    for index in reversed(range(len(layout.rounds))):
        checked = destinations if index == len(layout.rounds) - 1 else None
        kept = _verified_objects(client, in_flight, staging, index, needed, checked)
        rounds.insert(0, sorted(needed - kept))
        if index:  # the merges to run need their inputs, in the round before
            needed = {i for task in rounds[0] for i in layout.merge_inputs(index, task)}
    return rounds


def resumed_line(resumed: dict[str, int]) -> str:
    """What a run kept of a dead attempt, in words ("" when it took none over)."""
    if not resumed:
        return ""
    return (
        f"resumed: {resumed['map_outputs_kept']} of {resumed['map_outputs']} map outputs "
        f"and {resumed['shards_kept']} of {resumed['shards']} shards kept"
    )


def _discard_other_layouts(attempt: VersionAttempt, staging: Staging) -> None:
    """Staged objects of another layout (a cluster of another shape) are of no use."""
    fs, path = url_to_fs(attempt.uri)
    own = staging.uri.rstrip("/").rsplit("/", 1)[-1]
    for name in _names(fs, path):
        if name.startswith(EXCHANGE_PREFIX) and name != own:
            attempt.discard(f"{attempt.uri}/{name}")


def _verified_shards(
    client: Client, in_flight: int, attempt: VersionAttempt, shard_uris: list[str]
) -> dict[int, ShardEntry]:
    """Destination -> entry of every shard one of the attempt's write receipts vouches for
    and that hashes to it."""
    shards_uri, listed = _shard_listing(attempt, shard_uris)
    receipts_fs, receipts = url_to_fs(f"{attempt.uri}/{SHARD_RECEIPTS}")
    found = [f"{attempt.uri}/{SHARD_RECEIPTS}/{name}" for name in _names(receipts_fs, receipts)]
    kept = run_in_waves(
        client,
        kept_shards,
        ((uri, shards_uri) for uri in found),
        len(found),
        in_flight,
        listed=share(client, listed),
    )
    destination = {shard_path(uri): index for index, uri in enumerate(shard_uris)}
    return {
        destination[entry.path]: entry
        for entries in kept
        for entry in entries
        if entry.path in destination
    }


def _shard_listing(
    attempt: VersionAttempt, shard_uris: list[str]
) -> tuple[str, dict[str, tuple[int, str | None]]]:
    """The directory the shards' manifest paths are relative to, and what one listing of
    each of its split directories shows, by manifest path."""
    if not shard_uris:
        return attempt.uri, {}
    base = shard_uris[0].removesuffix(f"/{shard_path(shard_uris[0])}")
    listed: dict[str, tuple[int, str | None]] = {}
    for folder in sorted({shard_path(uri).rpartition("/")[0] for uri in shard_uris}):
        found = listing(*url_to_fs(f"{base}/{folder}".rstrip("/")))
        listed.update({f"{folder}/{name}".lstrip("/"): item for name, item in found.items()})
    return base, listed


def _verified_objects(
    client: Client,
    in_flight: int,
    staging: Staging,
    round_index: int,
    needed: set[int],
    destinations: set[int] | None,
) -> set[int]:
    """The `needed` objects of a round that are listed with a receipt and match it: by
    the listing's ETag alone (S3), or by the CRC-32s of the ranges of `destinations`
    (None: every range), computed on the cluster (local disk)."""
    if not needed:
        return set()
    fs, path = url_to_fs(staging.round_uri(round_index))
    listed = listed_objects(fs, path)
    objects = {item: staging.object(round_index, item) for item in sorted(needed)}
    receipts = {
        item: listed[staged.uri.rsplit("/", 1)[-1]]
        for item, staged in objects.items()
        if staged.uri.rsplit("/", 1)[-1] in listed
    }
    kept = {item for item, (_, check) in receipts.items() if not needs_read_back(check)}
    to_read = [item for item, (_, check) in receipts.items() if needs_read_back(check)]
    intact = run_in_waves(
        client,
        ranges_intact,
        ((objects[i].uri, *receipts[i], _wanted(objects[i], destinations)) for i in to_read),
        len(to_read),
        in_flight,
    )
    return kept | {item for item, ok in zip(to_read, intact, strict=True) if ok}


def _wanted(staged: StagedObject, destinations: set[int] | None) -> list[int] | None:
    """Which of the object's destinations (counted from its first) are in `destinations`."""
    if destinations is None:
        return None
    first = staged.first_destination
    return [d - first for d in range(first, first + staged.num_destinations) if d in destinations]


def _names(fs: Any, path: str) -> list[str]:
    return list(listing(fs, path))


@dataclass(frozen=True)
class AttemptProgress:
    """An unfinished attempt under a root: whose version, whether its holder still runs,
    how long since its last heartbeat, and what it has written of what it must."""

    version_id: str
    uri: str
    running: bool
    heartbeat_age_s: float | None
    written: dict[str, int]  # map_outputs, shards: with receipts
    totals: dict[str, int]  # map_outputs, shards: planned (empty before the exchange)


def unfinished_attempts(root: str) -> list[AttemptProgress]:
    """Every attempt staged under `root`, oldest version directory first."""
    fs, base = url_to_fs(staging_root(root))
    found = []
    for version in sorted(_names(fs, base)):
        for name in sorted(_names(fs, f"{base}/{version}")):
            found.append(_progress(fs, f"{base}/{version}/{name}", version))
    return found


def _progress(fs: Any, path: str, version_id: str) -> AttemptProgress:
    """What the attempt at `path` shows: its lease, totals and receipts (none verified)."""
    lease = read_lease(fs, f"{path}/{LEASE_NAME}")
    try:
        totals = json.loads(fs.cat_file(f"{path}/{TOTALS_NAME}"))
    except (OSError, ValueError):
        totals = {}
    totals = totals if isinstance(totals, dict) else {}
    maps = sum(
        _maps_written(fs, f"{path}/{n}", totals)
        for n in _names(fs, path)
        if n.startswith(EXCHANGE_PREFIX)
    )
    return AttemptProgress(
        version_id,
        fs.unstrip_protocol(path),
        not lease_expired(fs, path),
        time.time() - lease.heartbeat_at if lease else None,
        {"map_outputs": maps, "shards": _shards_written(fs, path)},
        totals,
    )


def _shards_written(fs: Any, path: str) -> int:
    """Shards the write receipts of the attempt at `path` list (not verified)."""
    count = 0
    for name in _names(fs, f"{path}/{SHARD_RECEIPTS}"):
        try:
            count += len(json.loads(fs.cat_file(f"{path}/{SHARD_RECEIPTS}/{name}")))
        except (OSError, ValueError):
            continue
    return count


def _maps_written(fs: Any, exchange: str, totals: dict[str, int]) -> int:
    """Map outputs with receipts under `exchange`; all of them once round 0 was discarded
    for a later round (which it only is after that round read every map output)."""
    rounds = _names(fs, exchange)
    if "round-0" not in rounds and rounds:
        return int(totals.get("map_outputs", 0))
    return len(listed_objects(fs, f"{exchange}/round-0"))
