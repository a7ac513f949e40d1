"""`ballast verify`'s check that no group and no duplicate content crosses splits, and
that no row lies across its night's time cut.

A version made with `dataset.group_column` or `dataset.duplicates: same_split`
(preprocessing/plan/split_keys.py) promises that every group, and every content (label,
features, group), sits in one split, in the version and in every ancestor of its chain.
A child's manifest lists every shard of its chain, so one read of the named version's
shards checks the chain: the group column and the content columns of each shard are
hashed as the scan hashes them, and a hash found in two splits (train, holdout, validation:
any pair) is a leak, named with its value and the shards that hold it on each side.
Memory: 8 bytes a row per kept hash while it runs (an audit, not a stage of the nightly
run). A version made without these
settings promises nothing of the kind, and nothing is checked.

A version made with `duplicates: drop` also promises that each night kept one row of a
content: a content held by two rows of different ids among one night's own shards (copies
that oversampling makes share their row's id) is named with the two shards (`kept_copies`).

A night made with `holdout_by: newest` records its cut in its delta (plan/time_cut.py):
each of its own shards' time column is read, and a train row in a bucket newer than the
first cutoff bucket (validation's, when the night has a validation cut), a validation row
outside its two cutoffs, or a holdout row in a bucket older than its cutoff, is named with
its shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from preprocessing.config import DatasetSpec
from preprocessing.contract.manifest import (
    Delta,
    Manifest,
    ManifestError,
    ShardEntry,
    read_current_version,
    read_manifest,
    shard_uri,
    version_dir,
)
from preprocessing.plan.counts import SPLITS
from preprocessing.plan.split_keys import content_columns, row_hashes
from preprocessing.plan.time_cut import SLICES, bucket_start, row_times

SHOWN = 10  # leaks named one by one (per kind and pair of splits); the rest are counted
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Leak:
    """A key (a group or a content) with rows in two splits, a shard of each."""

    version: str
    kind: str  # "group" or "duplicate content"
    value: str
    splits: tuple[str, str]
    shards: tuple[str, str]

    def line(self) -> str:
        return (
            f"LEAK version {self.version}: {self.kind} {self.value} has rows in "
            f"{self.splits[0]} ({self.shards[0]}) and in {self.splits[1]} ({self.shards[1]})"
        )


@dataclass(frozen=True)
class TimeLeak:
    """A row on the wrong side of its night's time cut (`holdout_by: newest`)."""

    version: str  # the night (a delta of the chain) whose cut the row breaks
    split: str
    time: str
    shard: str
    cutoff: str  # the start of the bucket the row should not cross
    side: str = "newer than"  # or "older than"

    def line(self) -> str:
        return (
            f"LEAK version {self.version}: a {self.split} row at {self.time} ({self.shard}) "
            f"is {self.side} the night's time cut (its bucket starts {self.cutoff})"
        )


def split_leaks(root: str, version: str | None = None) -> list[Leak | TimeLeak | CopyLeak]:
    """Every group and duplicate content of `version` (default `_CURRENT`'s) and its
    chain found in two splits, and every row across its night's time cut; empty when
    none, or when the version promises nothing."""
    version = version or read_current_version(root)
    if version is None:
        return []
    manifest, location = read_manifest(version_dir(root, version))
    return [
        *find_leaks(manifest, location, promised_keys(manifest)),
        *time_leaks(manifest, location),
        *kept_copies(manifest, location),
    ]


@dataclass(frozen=True)
class CopyLeak:
    """A content that two input rows of one night hold, both kept under `drop`."""

    version: str  # the night (a delta of the chain)
    value: str
    shards: tuple[str, str]

    def line(self) -> str:
        return (
            f"LEAK version {self.version}: duplicate content {self.value} kept twice in one "
            f"night under duplicates: drop ({self.shards[0]} and {self.shards[1]})"
        )


def kept_copies(manifest: Manifest, location: str) -> list[CopyLeak]:
    """Under `duplicates: drop`, each night's contents held by rows of two ids (SHOWN)."""
    settings = manifest.config.get("dataset", {})
    if settings.get("duplicates") != "drop":
        return []
    columns = content_columns(DatasetSpec.model_validate(settings))
    leaks: list[CopyLeak] = []
    for delta in manifest.deltas:
        own = [
            entry
            for split in manifest.splits.values()
            for entry in split.shards
            if (entry.version or manifest.version_id) == delta.version_id
        ]
        leaks += _copies_of_night(delta.version_id, own, location, columns, manifest.id_column)
    return leaks[:SHOWN]


def _copies_of_night(
    night: str, own: list[ShardEntry], location: str, columns: list[str], id_column: str
) -> list[CopyLeak]:
    """The contents that rows of two ids hold among `own`, night `night`'s shards."""
    rows = _distinct_rows(own, location, columns, id_column)
    contents, counts = np.unique(rows["content"], return_counts=True)
    named = []
    for key in contents[counts > 1][:SHOWN].tolist():
        holders = rows["shard"][rows["content"] == key][:2].tolist()
        table = _read(shard_uri(location, own[holders[0]]), columns)
        row = int(np.flatnonzero(row_hashes(table, columns) == np.uint64(key))[0])
        value = repr(table.slice(row, 1).to_pylist()[0])[:200]
        first, second = (f"{own[h].path} of v-{night}" for h in holders)
        named.append(CopyLeak(night, value, (first, second)))
    return named


def _distinct_rows(
    own: list[ShardEntry], location: str, columns: list[str], id_column: str
) -> np.ndarray:
    """(content hash, id hash, shard) of the rows of `own`, one per (content, id): the
    copies oversampling makes of a row count once."""
    parts = [np.zeros(0, dtype=[("content", np.uint64), ("id", np.uint64), ("shard", np.int64)])]
    for index, entry in enumerate(own):
        table = _read(shard_uri(location, entry), [*dict.fromkeys([*columns, id_column])])
        part = np.zeros(table.num_rows, parts[0].dtype)
        part["content"], part["shard"] = row_hashes(table, columns), index
        part["id"] = row_hashes(table, [id_column])
        parts.append(part)
    keys = np.concatenate(parts)
    keys = keys[np.lexsort((keys["id"], keys["content"]))]
    same = (keys["content"][1:] == keys["content"][:-1]) & (keys["id"][1:] == keys["id"][:-1])
    return keys[np.r_[True, ~same]] if len(keys) else keys


def time_leaks(manifest: Manifest, location: str) -> list[TimeLeak]:
    """The rows of each night (a delta recording a time cut) on the wrong side of it:
    a train row in a bucket newer than the first cutoff bucket (validation's, else the
    holdout's), a validation row outside its buckets, a holdout row in a bucket older than
    its cutoff (rows of a cutoff bucket itself are split by a hash of their file and row,
    which a shard does not keep); one named a shard, SHOWN in all."""
    leaks = []
    for delta in manifest.deltas:
        for split in SPLITS if delta.time_cut else ():
            own = [
                entry
                for entry in (manifest.split(split).shards if split in manifest.splits else [])
                if (entry.version or manifest.version_id) == delta.version_id
            ]
            leaks += [leak for entry in own if (leak := _time_leak(delta, split, entry, location))]
    return leaks[:SHOWN]


def _time_leak(delta: Delta, split: str, entry: ShardEntry, location: str) -> TimeLeak | None:
    """The first row of shard `entry` (of `split`) across `delta`'s time cut, or None."""
    cut = _checked_cut(delta)
    column = str(cut["column"])
    times = row_times(_read(shard_uri(location, entry), [column]).column(0), column)
    buckets = times >> int(cut["level"])
    bounds = {  # the cells a split's buckets lie between: (oldest, newest)
        "train": (None, cut.get("validation_cutoff", cut["cutoff"])),
        "validation": (cut.get("validation_cutoff"), cut["cutoff"]),
        "holdout": (cut["cutoff"], None),
    }[split]
    for bound, side in zip(bounds, ("older than", "newer than"), strict=True):
        if bound is None:
            continue
        wrong = buckets < bound // SLICES if side == "older than" else buckets > bound // SLICES
        if wrong.any():
            moment = EPOCH + timedelta(microseconds=int(times[wrong.argmax()]))
            start = bucket_start(int(bound), int(cut["level"]))
            shard = f"{entry.path} of v-{delta.version_id}"
            return TimeLeak(delta.version_id, split, moment.isoformat(), shard, start, side)
    return None


def _checked_cut(delta: Delta) -> dict:
    """`delta`'s time cut, its fields checked (a manifest is untrusted input)."""
    cut = delta.time_cut
    if not (
        isinstance(cut.get("column"), str)
        and type(cut.get("level")) is int
        and 0 <= cut["level"] < 64
        and all(type(cut.get(key, 0)) is int for key in ("cutoff", "validation_cutoff"))
        and "cutoff" in cut
    ):
        raise ManifestError(f"delta {delta.version_id}: time_cut {str(cut)[:200]} is no cut")
    return cut


def find_leaks(manifest: Manifest, location: str, checks: dict[str, list[str]]) -> list[Leak]:
    """The keys of `checks` (kind: its columns) that `manifest`'s version (read at
    `location`) holds in two splits, SHOWN of each kind and pair named, the rest counted."""
    present = [split for split in SPLITS if split in manifest.splits]
    pairs = [(a, b) for i, a in enumerate(present) for b in present[i + 1 :]]
    if not checks or not pairs:
        return []
    leaks = []
    for kind, columns in checks.items():
        sides = {split: _hashes(manifest, location, split, columns) for split in present}
        for pair in pairs:
            crossing = np.intersect1d(sides[pair[0]][0], sides[pair[1]][0])
            leaks += [
                _named(manifest, kind, columns, sides, pair, key)
                for key in crossing[:SHOWN].tolist()
            ]
            if len(crossing) > SHOWN:
                more = f"and {len(crossing) - SHOWN} more"
                leaks.append(Leak(manifest.version_id, kind, more, pair, ("...", "...")))
    return leaks


def promised_keys(manifest: Manifest) -> dict[str, list[str]]:
    """The keys whose splits `manifest`'s settings promise disjoint, with their columns."""
    settings = manifest.config.get("dataset", {})
    group, duplicates = settings.get("group_column"), settings.get("duplicates", "keep")
    if not group and duplicates == "keep":
        return {}
    spec = DatasetSpec.model_validate(settings)
    checks = {"group": [group]} if group else {}
    return {**checks, "duplicate content": content_columns(spec)}


Side = tuple[np.ndarray, np.ndarray, list[tuple[str, str]]]


def _hashes(manifest: Manifest, location: str, split: str, columns: list[str]) -> Side:
    """The distinct key hashes of a split, the shard of each (an index into the shards
    returned) and the shards (name, URI)."""
    hashes, owners = [], []
    shards: list[tuple[str, str]] = []
    for entry in manifest.split(split).shards:
        uri = shard_uri(location, entry)
        keys = row_hashes(_read(uri, columns), columns)
        hashes.append(keys)
        owners.append(np.full(len(keys), len(shards)))
        shards.append((f"{entry.path} of v-{entry.version or manifest.version_id}", uri))
    if not hashes:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64), shards
    unique, first = np.unique(np.concatenate(hashes), return_index=True)
    return unique, np.concatenate(owners)[first], shards


def _read(uri: str, columns: list[str]) -> pa.Table:
    fs, path = url_to_fs(uri)
    with fs.open(path, "rb") as handle:
        return pq.read_table(handle, columns=columns)


def _named(
    manifest: Manifest,
    kind: str,
    columns: list[str],
    sides: dict[str, Side],
    pair: tuple[str, str],
    key: int,
) -> Leak:
    """The leak of hash `key` between the `pair` of splits, its value read back from the
    shard of the first that holds it."""
    shard = {}
    for split in pair:
        unique, owner, shards = sides[split]
        shard[split] = shards[int(owner[np.searchsorted(unique, key)])]
    table = _read(shard[pair[0]][1], columns)
    row = int(np.flatnonzero(row_hashes(table, columns) == np.uint64(key))[0])
    values = table.slice(row, 1).to_pylist()[0]
    value = repr(values[columns[0]]) if kind == "group" else repr(values)[:200]
    names = (shard[pair[0]][0], shard[pair[1]][0])
    return Leak(manifest.version_id, kind, value, pair, names)
